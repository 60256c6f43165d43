# tests/cli.mk: tests of the moe command-line tool (issue 6).
