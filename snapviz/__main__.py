from snapviz.cli import main

main()
