"""`python -m cdr.cli`: the `cdr` command, for environments whose scripts are not on PATH."""

from cdr.cli import main

if __name__ == "__main__":
    main()
