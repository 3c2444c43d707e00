import sys

from trainguard.cli import main
from trainguard.cli.interrupt import forget_caught_interrupts

try:
    code = main()
finally:
    forget_caught_interrupts()  # a Ctrl-C main caught must not end `python -m` by SIGINT
sys.exit(code)
