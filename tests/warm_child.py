"""A module for tests/test_warm_start.py to run as ``python -m warm_child``: it reports what a
process sees of itself, then exits with the code it is given, or waits for a signal."""

import json
import os
import sys
import time

if __name__ == "__main__":
    print(json.dumps({
        "argv": sys.argv[1:],
        "cwd": os.getcwd(),
        "own_session": os.getsid(0) == os.getpid(),
        "marker": os.environ.get("WARM_CHILD_MARKER"),
        "torch_imported": "torch" in sys.modules,
        "name": __name__,
        "ppid": os.getppid(),
        "sys_path": sys.path,
    }), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if sys.argv[1] == "wait":
        time.sleep(60)
    sys.exit(int(sys.argv[1]))
