"""The import guards the torch cross-checks share: torch from Debian's python3-torch, or exit 1 with
one line naming the fix (exit 0, a visible skip, with MXLAB_TORCH_OPTIONAL=1); and the MX
emulation library (microxcaling), which lives outside the repository."""
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


def require_microxcaling(tool):
    """Put microxcaling on sys.path and return its directory: MXLAB_MICROXCALING, else
    shared/peers/microxcaling beside or above the checkout; exit 1 with one line without it."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    candidates = [os.environ.get("MXLAB_MICROXCALING", "")] + [
        os.path.join(root, *([".."] * up), "shared", "peers", "microxcaling") for up in range(3)]
    path = next((p for p in candidates if p and os.path.isfile(os.path.join(p, "mx", "__init__.py"))), None)
    if path is None:
        print(f"{tool}: microxcaling not found (looked for shared/peers/microxcaling beside and above the "
              "checkout); set MXLAB_MICROXCALING to its directory")
        sys.exit(1)
    sys.path.insert(0, path)
    return path
