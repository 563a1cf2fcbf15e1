from gpuforge.cli.main import main

main()
