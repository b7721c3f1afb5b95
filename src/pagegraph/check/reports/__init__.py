"""The report a check returns, and its decode-step section."""
