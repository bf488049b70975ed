"""Followers of a real pool's files (shadow mode): job event logs, history files and
Accountantnew.log read from a stored position into events, surviving rotation, truncation and
kill -9 (`base`); `poolledger follow` runs them."""
