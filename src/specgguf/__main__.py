import sys

try:
    from .cli.main import main
except KeyboardInterrupt:  # Ctrl-C while Python imports
    print("\nspecgguf: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
