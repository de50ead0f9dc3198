"""``python -m collectors.matrix ...`` runs ``snapviz matrix``."""

from collectors.cli import matrix

if __name__ == "__main__":
    matrix(prog_name="python -m collectors.matrix")
