from tidal.agent.main import main

main()
