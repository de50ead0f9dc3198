from snapviz.cli import run

run()
