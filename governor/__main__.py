"""`python -m governor`: the same entry as the console script."""

from governor.main import run

if __name__ == "__main__":
    run()
