"""``python -m nsqd_threaded.admin``: the ``nsqadmin-threaded`` command."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="nsqadmin-threaded")
