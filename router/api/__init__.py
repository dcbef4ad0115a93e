"""Generated gRPC code for protos/kvwire/v1/router.proto (package kvwire.v1); do not edit by hand.

Regenerate with ``python -m router.api.regenerate``; a test fails when these files are stale.
"""
