"""The controller process (local mode): drives the pure control core over HTTP."""
