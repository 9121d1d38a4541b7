"""Process exit codes, named (values from BSD sysexits.h where one fits).

The supervisor reads a child's code to choose between restarting it and
backing off: a child that exits with :data:`CONFIG` or :data:`UNAVAILABLE`
failed to boot and is restarted only after a growing delay.
"""

OK = 0
#: a check failed (``crawlctl verify``) or the crawl did not complete.
FAILED = 1
#: bad command line.
USAGE = 64
#: bad input data (a seed URL that cannot be crawled).
DATAERR = 65
#: an input does not exist or cannot be read: no crawl with the given id in
#: Redis, or (``crawlctl verify``) no artifact.
NOINPUT = 66
#: a needed service (Redis) is unreachable or unfit.
UNAVAILABLE = 69
#: an internal error.
SOFTWARE = 70
#: cannot create or write an output file.
CANTCREAT = 73
#: invalid configuration.
CONFIG = 78
#: interrupted by SIGINT (128 + 2, as shells report it).
INTERRUPTED = 130
