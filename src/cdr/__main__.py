"""`python -m cdr`: the same command as `cdr`, for environments whose scripts are not on PATH."""

from cdr.cli import main

if __name__ == "__main__":
    main()
