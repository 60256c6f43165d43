# cli/: the moe command-line tool (issue 6).
