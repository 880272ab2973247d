"""A user's own sitecustomize: it must still run when Tidal's is first on the path."""

import os

os.environ["USER_SITECUSTOMIZE"] = "ran"
print("user sitecustomize ran", flush=True)
