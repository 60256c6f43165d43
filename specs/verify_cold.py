#!/usr/bin/env python3
"""Compares a proof run without the cache (`make verify-cold`) with the prover results of the cache file.

  verify_cold.py WORKDIR CACHE

WORKDIR is the folder of a specs/verify.sh run (VERIFY_CACHE=none: every goal went to the provers); it
holds goals-unique.txt (FILE FUNCTION GOAL proved|UNPROVED), smoke-unique.txt (FILE FUNCTION GOAL
passed|FAILED LOCATION) and digests.txt (FILE GOAL PROVER DIGEST).  CACHE is a cache file as
specs/wp-cache.txt (DIGEST {WP's JSON record}).  WP keys a prover's result by the digest of the goal
exactly as sent to that prover, so a digest of this run found in CACHE is the same goal, sent to the same
prover, as in the run that wrote CACHE.

A goal (a smoke goal included: "proved" there means the smoke test failed) that CACHE says some prover
proved and this run did not prove is a failure, named with its file, function and goal.  Exit status 1 on
any, or when the run has no goal; 0 otherwise.  The other differences are counted: goals whose digests CACHE
does not hold (the goal changed since, or it is new), goals this run proved that CACHE had unproved, and
CACHE entries that no goal of this run used.
"""
import os
import re
import sys

VERDICT = re.compile(r'^\{.*"verdict": "([a-z]+)"')


def read_rows(path, fields):
    rows = []
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= fields:
                    rows.append(parts)
    return rows


def read_cache(path):
    verdicts = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            digest, _, record = line.strip().partition(" ")
            if not digest:
                continue
            # WP's records are not strict JSON (it writes a time of 3 s as `3.`): read the verdict alone
            verdict = VERDICT.search(record)
            if not verdict:
                sys.exit("verify_cold.py: %s:%d: not DIGEST { ... \"verdict\": ... }" % (path, number))
            verdicts[digest] = verdict.group(1)
    return verdicts


def compare(work, cache_path):
    verdicts = read_cache(cache_path)
    digests = {}
    for path, goal, prover, digest in read_rows(os.path.join(work, "digests.txt"), 4):
        digests.setdefault((path, goal), []).append((prover, digest))
    goals = [(p, f, g, st == "proved", "goal") for p, f, g, st in read_rows(os.path.join(work, "goals-unique.txt"), 4)]
    goals += [(p, f, g, st != "passed", "smoke test")
              for p, f, g, st, _ in read_rows(os.path.join(work, "smoke-unique.txt"), 5)]
    failures, unknown, newly, agreed, qed, used = [], 0, 0, 0, 0, set()
    for path, fct, goal, proved, kind in goals:
        sent = digests.get((path, goal), [])
        if not sent:
            qed += 1  # closed by WP's simplifier (Qed): no prover, no cache entry
            continue
        in_cache = [(prover, d) for prover, d in sent if d in verdicts]
        used.update(d for _, d in in_cache)
        cache_proved = [prover for prover, d in in_cache if verdicts[d] == "valid"]
        if not in_cache:
            unknown += 1
        elif cache_proved and not proved:
            failures.append("%s: %s: %s %s: the cache says %s proved it; this run did not"
                            % (path, fct, kind, goal, " and ".join(sorted(cache_proved))))
        elif proved and not cache_proved:
            newly += 1
        else:
            agreed += 1
    print("verify_cold: %d goals and smoke tests: %d with the cache's result, %d closed by Qed (no prover), "
          "%d not in the cache (changed or new), %d proved now and not in the cache's results; "
          "%d of the cache's %d entries used"
          % (len(goals), agreed, qed, unknown, newly, len(used), len(verdicts)))
    if not goals:
        print("verify_cold: FAIL: no goals in %s (did the run happen?)" % work)
        return 1
    for line in failures:
        print("verify_cold: FAIL: " + line)
    if failures:
        print("verify_cold: %d goals proved in the cache are not proved without it" % len(failures))
        return 1
    return 0


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: verify_cold.py WORKDIR CACHE")
    if not os.path.isfile(sys.argv[2]):
        sys.exit("verify_cold.py: CACHE %s: no such file" % sys.argv[2])
    return compare(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    sys.exit(main())
