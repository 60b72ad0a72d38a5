from moebench.cli import main

if __name__ == "__main__":  # not in a worker process started by spawn (moebench.precompile)
    main()
