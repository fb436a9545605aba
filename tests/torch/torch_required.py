"""The import guard the torch cross-checks share: torch from Debian's python3-torch, or exit 1 with
one line naming the fix (exit 0, a visible skip, with MXLAB_TORCH_OPTIONAL=1)."""
import os
import sys


def require_torch(tool):
    """Return when `import torch` works under this interpreter; else print why and exit."""
    try:
        import torch  # noqa: F401
    except ImportError:
        msg = (f"{tool}: {sys.executable} cannot import torch; install Debian's python3-torch "
               "(scripts/install-deps.sh) and run with /usr/bin/python3")
        if os.environ.get("MXLAB_TORCH_OPTIONAL") == "1":
            print(msg + " - skipped (MXLAB_TORCH_OPTIONAL=1)")
            sys.exit(0)
        print(msg)
        sys.exit(1)
