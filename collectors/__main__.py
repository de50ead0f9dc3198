"""``python -m collectors ...`` runs ``snapviz collect``."""

from .cli import collect

if __name__ == "__main__":
    collect(prog_name="python -m collectors")
