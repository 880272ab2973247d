"""An ordinary Python script without torch: what it prints must not change when it runs as a Tidal rank."""

import hashlib
import os
import subprocess
import sys

print("argv", sys.argv[1:])
print("torch imported", "torch" in sys.modules)
print("tidal variables", sorted(k for k in os.environ if k.startswith("TIDAL")))
print("user sitecustomize", os.environ.get("USER_SITECUSTOMIZE", "no"))
print("digest", hashlib.sha256(b"".join(i.to_bytes(4, "little") for i in range(10000))).hexdigest())
child = subprocess.run([sys.executable, "-c", "import os, sys; print('child tidal variables', "
                        "sorted(k for k in os.environ if k.startswith('TIDAL')), 'torch' in sys.modules)"],
                       capture_output=True, text=True, check=True)
print(child.stdout.strip())
with open("plain.out", "w") as f:
    f.write("written\n")
print("to stderr", file=sys.stderr)
sys.exit(3)
