# specs/: semantics decisions and (later) the ACSL logic and Frama-C/WP setup.
EXTRA_DIST += specs/SEMANTICS.md specs/DECISIONS.md
EXTRA_DIST += specs/PROPTEST.md
