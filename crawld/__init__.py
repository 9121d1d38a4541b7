"""crawld: a distributed, polite web crawler for site-health audits.

Workers on many machines share one frontier in Redis; every crawl ends in one
Parquet artifact.  See README.md for the operator view and the module
docstrings for the parts.
"""

__version__ = "0.1.0"
