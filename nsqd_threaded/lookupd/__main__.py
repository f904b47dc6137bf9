"""``python -m nsqd_threaded.lookupd``: the ``nsqlookupd-threaded`` command."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="nsqlookupd-threaded")
