"""`poolledger collector`: a CEDAR endpoint that a real HTCondor pool advertises to.

The wire and its security (`cedar`, `security`, `server`) hand decoded commands to a
`CollectorBackend` (`port`); the backend turns them into events on the log and answers queries
from the folded state.
"""
