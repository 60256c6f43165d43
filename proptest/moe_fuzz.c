/*
 * moe-fuzz: the property-based fuzzer of libmoe (proptest/README.md, specs/PROPTEST.md).
 *
 * The parent process never calls the library.  Cases run in a worker process (fork) that reads
 * requests from a pipe and answers with the outcome, so a crash, an exit() or a hang in a case (or a
 * device fault on the GPU) becomes a reported failure of that case, which is then shrunk like any
 * other.  Inside the worker a signal handler, an atexit handler and alarm() report the choices the
 * case had drawn when it died.  After any failure the worker is replaced (a CUDA context may be
 * unusable after a fault).
 */
#include "pt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_REPORTED_FAILURES 3 /* per op: after this many the op leaves the rotation */

static void usage(FILE *f)
{
    fprintf(f,
"usage: moe-fuzz [--seconds S | --cases N] [--seed X] [--ops OP,OP,...] [--backend ref|cuda]\n"
"                [--max-size N] [--shrink-seconds S] [--timeout S] [--regressions FILE] [--no-fork]\n"
"       moe-fuzz --replay LINE [--backend ref|cuda] [--no-fork]\n"
"       moe-fuzz --list\n"
"\n"
"Property-based tests of libmoe: random cases from generators (routings, shapes, dtypes, every grouped\n"
"GEMM mode, MLP options, value distributions), checked against the float64 oracle's derived bounds\n"
"and metamorphic relations.  Every failing case is shrunk (fewer tokens and experts, smaller N, K, H,\n"
"I, simpler options and values) and printed with a reproducer line.\n"
"\n"
"Options:\n"
"  --seconds S         fuzz for S seconds (default 10), ops in turn, size growing from 0 to --max-size\n"
"                      over the first half and cycling over the second\n"
"  --cases N           instead: exactly N cases per op, size growing from 0 to --max-size (what\n"
"                      `make check` runs: deterministic for a given seed)\n"
"  --seed X            run seed (decimal or 0x hex); default: from the clock.  Printed first.\n"
"  --ops LIST          comma-separated ops (default: every op of the backend; --list names them)\n"
"  --backend B         ref (default): the CPU reference;  cuda: the GPU ops (exit 77 without a device)\n"
"  --max-size N        cap of the size parameter, 0..100 (default 100)\n"
"  --shrink-seconds S  time budget to shrink one failure (default 60)\n"
"  --timeout S         a case running longer is killed and reported as a failure (default 120)\n"
"  --regressions FILE  first replay every reproducer in FILE (one per line; '#' starts a comment)\n"
"  --replay LINE       run the one case LINE (a reproducer), print what it checked and the outcome\n"
"  --no-fork           run cases in this process (debugging; a crash then ends the run)\n"
"  --list              list the ops\n"
"  --help              this text\n"
"\n"
"Reproducer lines (printed for every failure, original and shrunk):\n"
"  OP:SIZE:s=SEED      the case drawn from PRNG seed SEED (hex) at size SIZE\n"
"  OP:SIZE:c=V.V.V     the case of that recorded choice sequence (hex values; missing ones are 0)\n"
"Replay with: moe-fuzz --replay OP:SIZE:...   (the op decides the backend: gpu-* ops need cuda)\n"
"\n"
"Output: the seed, a progress line (cases/s, current size), each failure as it is found, then a table\n"
"per op: cases run, cases discarded (not applicable), the worst error seen as a fraction of its\n"
"bound (1.0 = at the bound), failures; then the reproducer of every failure.\n"
"Exit status: 0 no failure, 1 a failure, 2 usage error, 77 --backend cuda without a usable GPU.\n"
"\n"
"Nightly: moe-fuzz --seconds 3600 --regressions proptest/regressions.txt   (and with --backend cuda\n"
"on a GPU machine).  Append each new shrunk reproducer to proptest/regressions.txt with a comment.\n");
}

/* ---------------------------------------------------------------------------------------------------
 * running one case (in the worker, or here with --no-fork)
 * ------------------------------------------------------------------------------------------------- */
typedef struct case_result {
    int outcome;
    double worst;
    uint64_t *choices;
    size_t count;
    char tag[48];
    char *msg, *desc;
} case_result;

static void result_free(case_result *r)
{
    free(r->choices), free(r->msg), free(r->desc);
    memset(r, 0, sizeof *r);
}

static size_t trimmed(const uint64_t *v, size_t n)
{
    while (n > 0 && v[n - 1] == 0)
        n--;
    return n;
}

/* The case in flight in this process (for the crash handlers). */
static pt_source current_src;
static pt_case current_case;
static volatile sig_atomic_t case_in_flight;
static int response_fd = -1;

typedef struct req_hdr {
    int32_t op, size, has_seed, pad;
    uint64_t seed, count;
} req_hdr;

typedef struct res_hdr {
    int32_t outcome, pad;
    double worst;
    uint64_t count, tag_len, msg_len, desc_len;
} res_hdr;

/* read() or write() the whole buffer; async-signal-safe.  Returns 0, or -1 on EOF or an error. */
static int transfer(int fd, void *buf, size_t n, int writing)
{
    char *p = buf;
    while (n > 0) {
        const ssize_t done = writing ? write(fd, p, n) : read(fd, p, n);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return -1;
        p += done, n -= (size_t)done;
    }
    return 0;
}

static int write_all(int fd, const void *buf, size_t n) { return transfer(fd, (void *)buf, n, 1); }

static size_t cstrlen(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

/* Async-signal-safe: only write() on data already in memory. */
static void emit(int fd, int outcome, double worst, const uint64_t *ch, size_t n, const char *tag, const char *msg,
                 const char *desc)
{
    res_hdr h = {outcome, 0, worst, n, cstrlen(tag), cstrlen(msg), cstrlen(desc)};
    if (write_all(fd, &h, sizeof h) == 0 && write_all(fd, ch, n * sizeof *ch) == 0 && write_all(fd, tag, h.tag_len) == 0 &&
        write_all(fd, msg, h.msg_len) == 0)
        (void)write_all(fd, desc, h.desc_len);
}

static void emit_death(const char *tag, const char *msg)
{
    if (!case_in_flight || response_fd < 0)
        return;
    case_in_flight = 0;
    emit(response_fd, PT_FAIL, current_case.worst_ratio, current_src.used, trimmed(current_src.used, current_src.count), tag,
         msg, current_case.desc);
}

static void on_fatal_signal(int sig)
{
    const char *msg = sig == SIGSEGV ? "the case died of SIGSEGV (invalid memory access)\n"
                      : sig == SIGBUS ? "the case died of SIGBUS\n"
                      : sig == SIGFPE ? "the case died of SIGFPE\n"
                      : sig == SIGILL ? "the case died of SIGILL\n"
                      : sig == SIGABRT ? "the case called abort() (SIGABRT)\n"
                                       : "the case ran past --timeout and was stopped (SIGALRM)\n";
    emit_death(sig == SIGALRM ? "timeout" : "crash", msg);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_exit_in_case(void) { emit_death("crash", "the case called exit() (a REQUIRE of the test library failed)\n"); }

static const pt_op *op_at(int index) { return &pt_ops[index]; }

static int op_index(const pt_op *op) { return (int)(op - pt_ops); }

static void run_case(int op, moe_backend backend, int size, int has_seed, uint64_t seed, const uint64_t *choices,
                     size_t count)
{
    free(current_src.used);
    memset(&current_src, 0, sizeof current_src);
    memset(&current_case, 0, sizeof current_case);
    current_src.size = size;
    if (has_seed) {
        pt_rng_seed(&current_src.rng, seed);
    } else {
        current_src.replay = 1;
        current_src.given = choices;
        current_src.given_count = count;
    }
    current_case.src = &current_src;
    current_case.backend = backend;
    case_in_flight = 1;
    op_at(op)->run(&current_case);
    case_in_flight = 0;
    if (current_src.overrun && current_case.outcome == PT_PASS)
        pt_discard(&current_case, "the case drew more than PT_MAX_CHOICES choices");
}

static void collect(case_result *r)
{
    r->outcome = current_case.outcome;
    r->worst = current_case.worst_ratio;
    r->count = trimmed(current_src.used, current_src.count);
    r->choices = xmalloc((r->count + 1) * sizeof(uint64_t));
    if (r->count)
        memcpy(r->choices, current_src.used, r->count * sizeof(uint64_t));
    snprintf(r->tag, sizeof r->tag, "%s", current_case.tag);
    r->msg = strdup(current_case.msg);
    r->desc = strdup(current_case.desc);
}

static int read_all(int fd, void *buf, size_t n) { return transfer(fd, buf, n, 0); }

static void worker_main(int req_fd, int res_fd, int err_fd, moe_backend backend, int timeout_s)
{
    response_fd = res_fd;
    dup2(err_fd, STDERR_FILENO);
    dup2(err_fd, STDOUT_FILENO);
    const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], on_fatal_signal);
    atexit(on_exit_in_case);
    for (;;) {
        req_hdr h;
        if (read_all(req_fd, &h, sizeof h) != 0)
            _exit(0);
        uint64_t *choices = xmalloc((size_t)(h.count + 1) * sizeof(uint64_t));
        if (read_all(req_fd, choices, (size_t)h.count * sizeof(uint64_t)) != 0)
            _exit(0);
        if (ftruncate(err_fd, 0) != 0 || lseek(err_fd, 0, SEEK_SET) < 0)
            _exit(3);
        alarm((unsigned)timeout_s);
        run_case(h.op, backend, h.size, h.has_seed, h.seed, choices, (size_t)h.count);
        alarm(0);
        fflush(stdout);
        fflush(stderr);
        emit(res_fd, current_case.outcome, current_case.worst_ratio, current_src.used,
             trimmed(current_src.used, current_src.count), current_case.tag, current_case.msg, current_case.desc);
        free(choices);
    }
}

/* ---------------------------------------------------------------------------------------------------
 * the parent: workers, evaluation
 * ------------------------------------------------------------------------------------------------- */
typedef struct fuzz {
    moe_backend backend;
    int no_fork, timeout_s, max_size;
    double shrink_seconds;
    pid_t pid;            /* the worker, or 0 */
    int req_fd, res_fd, err_fd;
    long evaluations;
} fuzz;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void worker_stop(fuzz *f, int kill_it)
{
    if (f->pid <= 0)
        return;
    close(f->req_fd);
    close(f->res_fd);
    if (kill_it)
        kill(f->pid, SIGKILL);
    int status;
    while (waitpid(f->pid, &status, 0) < 0 && errno == EINTR)
        ;
    f->pid = 0;
}

static void worker_start(fuzz *f)
{
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) {
        perror("moe-fuzz: pipe");
        exit(2);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("moe-fuzz: fork");
        exit(2);
    }
    if (pid == 0) {
        close(to_child[1]);
        close(from_child[0]);
        worker_main(to_child[0], from_child[1], f->err_fd, f->backend, f->timeout_s);
        _exit(0);
    }
    close(to_child[0]);
    close(from_child[1]);
    f->pid = pid, f->req_fd = to_child[1], f->res_fd = from_child[0];
}

/* What the worker wrote to stderr during the last case (at most the last 3000 bytes). */
static char *worker_stderr(const fuzz *f)
{
    off_t size = lseek(f->err_fd, 0, SEEK_END);
    if (size <= 0)
        return strdup("");
    const off_t from = size > 3000 ? size - 3000 : 0;
    char *buf = xmalloc((size_t)(size - from) + 1);
    ssize_t got = pread(f->err_fd, buf, (size_t)(size - from), from);
    buf[got > 0 ? got : 0] = '\0';
    return buf;
}

/* Waits until the worker starts answering (or the deadline passes: -2), then reads n bytes (-1 on EOF).
 * The worker writes each answer in one go, so only its first byte needs the deadline. */
static int read_timed(int fd, void *buf, size_t n, double deadline)
{
    for (;;) {
        const double left = deadline - now();
        if (left <= 0)
            return -2;
        struct pollfd pfd = {fd, POLLIN, 0};
        const int ready = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (ready > 0)
            return read_all(fd, buf, n);
        if (ready < 0 && errno != EINTR)
            return -1;
    }
}

static void evaluate(fuzz *f, int op, int size, int has_seed, uint64_t seed, const uint64_t *choices, size_t count,
                     case_result *r)
{
    memset(r, 0, sizeof *r);
    f->evaluations++;
    if (f->no_fork) {
        run_case(op, f->backend, size, has_seed, seed, choices, count);
        collect(r);
        return;
    }
    if (f->pid <= 0)
        worker_start(f);
    req_hdr h = {op, size, has_seed, 0, seed, has_seed ? 0 : count};
    if (write_all(f->req_fd, &h, sizeof h) != 0 || write_all(f->req_fd, choices, (size_t)h.count * sizeof(uint64_t)) != 0) {
        worker_stop(f, 1); /* died between cases: start afresh */
        worker_start(f);
        if (write_all(f->req_fd, &h, sizeof h) != 0 || write_all(f->req_fd, choices, (size_t)h.count * sizeof(uint64_t)) != 0) {
            fprintf(stderr, "moe-fuzz: cannot talk to a fresh worker\n");
            exit(2);
        }
    }
    const double deadline = now() + f->timeout_s + 10.0; /* alarm() fires first; this is the backstop */
    res_hdr rh;
    int got = read_timed(f->res_fd, &rh, sizeof rh, deadline);
    if (got == 0) {
        r->count = (size_t)rh.count;
        r->choices = xmalloc((r->count + 1) * sizeof(uint64_t));
        char *tag = xmalloc(rh.tag_len + 1);
        r->msg = xmalloc(rh.msg_len + 1), r->desc = xmalloc(rh.desc_len + 1);
        got = read_timed(f->res_fd, r->choices, r->count * sizeof(uint64_t), deadline);
        if (got == 0)
            got = read_timed(f->res_fd, tag, rh.tag_len, deadline);
        if (got == 0)
            got = read_timed(f->res_fd, r->msg, rh.msg_len, deadline);
        if (got == 0)
            got = read_timed(f->res_fd, r->desc, rh.desc_len, deadline);
        tag[rh.tag_len] = r->msg[rh.msg_len] = r->desc[rh.desc_len] = '\0';
        snprintf(r->tag, sizeof r->tag, "%s", tag);
        free(tag);
        r->outcome = rh.outcome, r->worst = rh.worst;
    }
    if (got != 0) {
        /* the worker died without a word (SIGKILL, a signal during the handler) or hung */
        result_free(r);
        r->outcome = PT_FAIL;
        snprintf(r->tag, sizeof r->tag, "%s", got == -2 ? "timeout" : "crash");
        r->msg = strdup(got == -2 ? "the worker stopped answering and was killed\n" : "the worker died\n");
        r->desc = strdup("");
        r->choices = xmalloc((count + 1) * sizeof(uint64_t));
        r->count = has_seed ? 0 : count;
        if (r->count)
            memcpy(r->choices, choices, count * sizeof(uint64_t));
        worker_stop(f, 1);
    }
    if (r->outcome == PT_FAIL) {
        char *err = worker_stderr(f);
        if (err[0]) {
            const size_t a = strlen(r->msg), b = strlen(err);
            char *m = xmalloc(a + b + 40);
            snprintf(m, a + b + 40, "%s  stderr of the case:\n%s", r->msg, err);
            free(r->msg);
            r->msg = m;
        }
        free(err);
        worker_stop(f, 1); /* a fresh worker (and CUDA context) for the next case */
    }
}

/* ---------------------------------------------------------------------------------------------------
 * shrinking
 * ------------------------------------------------------------------------------------------------- */
typedef struct shrink_state {
    fuzz *f;
    int op;
    int size;
    case_result best;
    double deadline;
    long tries;
} shrink_state;

/* Runs candidate (size, choices); adopts it when it fails with the same tag and is simpler. */
static int try_candidate(shrink_state *s, int size, const uint64_t *choices, size_t count)
{
    if (now() > s->deadline)
        return 0;
    case_result r;
    s->tries++;
    evaluate(s->f, s->op, size, 0, 0, choices, count, &r);
    const int simpler = size < s->size || (size == s->size && pt_shortlex_less(r.choices, r.count, s->best.choices, s->best.count));
    if (r.outcome == PT_FAIL && strcmp(r.tag, s->best.tag) == 0 && simpler) {
        result_free(&s->best);
        s->best = r;
        s->size = size;
        return 1;
    }
    result_free(&r);
    return 0;
}

static void shrink(fuzz *f, int op, int size, case_result *failing, int *out_size, long *tries, double *seconds)
{
    const double start = now();
    shrink_state s = {f, op, size, *failing, start + f->shrink_seconds, 0};
    memset(failing, 0, sizeof *failing);
    int changed = 1;
    while (changed && now() < s.deadline) {
        changed = 0;
        /* a smaller size parameter with the same choices */
        const int sizes[4] = {0, s.size / 4, s.size / 2, s.size - 1};
        for (int i = 0; i < 4; i++)
            if (sizes[i] >= 0 && sizes[i] < s.size) {
                uint64_t *copy = xmalloc((s.best.count + 1) * sizeof(uint64_t));
                memcpy(copy, s.best.choices, s.best.count * sizeof(uint64_t));
                changed |= try_candidate(&s, sizes[i], copy, s.best.count);
                free(copy);
            }
        /* delete blocks of choices, then zero them, from the end (later choices are the details) */
        for (int pass = 0; pass < 2; pass++)
            for (size_t width = 8; width >= 1; width /= 2) {
                for (size_t i = s.best.count; i-- > 0;) {
                    if (i + width > s.best.count)
                        continue;
                    size_t n = s.best.count;
                    uint64_t *cand = xmalloc((n + 1) * sizeof(uint64_t));
                    memcpy(cand, s.best.choices, n * sizeof(uint64_t));
                    int useful = 1;
                    if (pass == 0) {
                        memmove(cand + i, cand + i + width, (n - i - width) * sizeof(uint64_t));
                        n -= width;
                    } else {
                        useful = 0;
                        for (size_t j = i; j < i + width; j++)
                            useful |= cand[j] != 0, cand[j] = 0;
                    }
                    if (useful)
                        changed |= try_candidate(&s, s.size, cand, n);
                    free(cand);
                }
                if (width == 1)
                    break;
            }
        /* lower each remaining choice: binary search for the smallest value that still fails */
        for (size_t i = 0; i < s.best.count && now() < s.deadline; i++) {
            uint64_t lo = 0, hi = s.best.choices[i]; /* hi fails; find the smallest failing in [lo, hi] */
            while (lo < hi && now() < s.deadline) {
                const uint64_t mid = lo + (hi - lo) / 2;
                if (i >= s.best.count)
                    break;
                uint64_t *cand = xmalloc((s.best.count + 1) * sizeof(uint64_t));
                memcpy(cand, s.best.choices, s.best.count * sizeof(uint64_t));
                cand[i] = mid;
                if (try_candidate(&s, s.size, cand, s.best.count)) {
                    changed = 1;
                    hi = i < s.best.count ? s.best.choices[i] : 0;
                } else {
                    lo = mid + 1;
                }
                free(cand);
            }
        }
    }
    *failing = s.best;
    *out_size = s.size;
    *tries = s.tries;
    *seconds = now() - start;
}

/* ---------------------------------------------------------------------------------------------------
 * reporting and the run
 * ------------------------------------------------------------------------------------------------- */
typedef struct op_stats {
    int op;
    long cases, discards, failures;
    double worst;
    char *repro[MAX_REPORTED_FAILURES];
} op_stats;

static void print_message(const char *msg)
{
    /* indent every line of msg by four spaces */
    const char *p = msg;
    while (*p) {
        const char *nl = strchr(p, '\n');
        const int len = nl ? (int)(nl - p) : (int)strlen(p);
        printf("    %.*s\n", len, p);
        p += len + (nl != NULL);
    }
}

static char *report_failure(fuzz *f, op_stats *st, int size, uint64_t seed, case_result *r, int do_shrink)
{
    const char *name = op_at(st->op)->name;
    char *original = pt_format_repro(name, size, 1, seed, NULL, 0);
    printf("\nFAIL %s [%s]: %s\n", name, r->tag, r->desc);
    print_message(r->msg);
    printf("  reproducer: proptest/moe-fuzz --replay %s\n", original);
    fflush(stdout);
    if (!do_shrink)
        return original;
    int shrunk_size;
    long tries;
    double secs;
    shrink(f, st->op, size, r, &shrunk_size, &tries, &secs);
    char *line = pt_format_repro(name, shrunk_size, 0, 0, r->choices, r->count);
    printf("  shrunk in %ld runs (%.1f s) to [%s]: %s\n", tries, secs, r->tag, r->desc);
    print_message(r->msg);
    printf("  reproducer: proptest/moe-fuzz --replay %s\n", line);
    fflush(stdout);
    free(original);
    return line;
}

static void record_case(op_stats *st, const case_result *r)
{
    st->cases++;
    if (r->outcome == PT_DISCARD)
        st->discards++;
    if (r->worst > st->worst || isnan(r->worst))
        st->worst = isnan(r->worst) ? INFINITY : r->worst;
}

static int parse_seed(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static int cuda_usable(void)
{
    /* probe in a child: CUDA must not be initialised in the parent, whose forks run the cases */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        _exit(moe_backend_available(MOE_BACKEND_CUDA) ? 0 : 3);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0)
        return 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static int replay_line(fuzz *f, const char *line, int verbose, op_stats *stats, int nstats)
{
    char opname[64], err[512];
    int size, has_seed;
    uint64_t seed, *choices;
    size_t count;
    if (pt_parse_repro(line, opname, sizeof opname, &size, &has_seed, &seed, &choices, &count, err, sizeof err) != 0) {
        fprintf(stderr, "moe-fuzz: %s\n", err);
        return -2;
    }
    const pt_op *op = pt_find_op(opname);
    if (op == NULL) {
        fprintf(stderr, "moe-fuzz: unknown op '%s' in '%s' (--list names them)\n", opname, line);
        free(choices);
        return -2;
    }
    if ((op->cuda != 0) != (f->backend == MOE_BACKEND_CUDA)) {
        free(choices);
        return -1; /* another backend's case */
    }
    case_result r;
    evaluate(f, op_index(op), size, has_seed, seed, choices, count, &r);
    for (int i = 0; i < nstats; i++)
        if (stats[i].op == op_index(op)) {
            record_case(&stats[i], &r);
            if (r.outcome == PT_FAIL && stats[i].failures < MAX_REPORTED_FAILURES)
                stats[i].repro[stats[i].failures++] = strdup(line);
        }
    if (verbose || r.outcome == PT_FAIL) {
        printf("%s %s\n  case: %s\n", r.outcome == PT_FAIL ? "FAIL" : r.outcome == PT_DISCARD ? "DISCARD" : "PASS", line,
               r.desc);
        if (r.outcome != PT_PASS)
            print_message(r.msg);
        printf("  worst error / bound: %.4g\n", r.worst);
    }
    const int failed = r.outcome == PT_FAIL;
    result_free(&r);
    free(choices);
    return failed;
}

int main(int argc, char **argv)
{
    fuzz f = {MOE_BACKEND_REF, 0, 120, PT_MAX_SIZE, 60.0, 0, -1, -1, -1, 0};
    double seconds = 10.0;
    long cases = 0;
    uint64_t seed = 0;
    int have_seed = 0;
    const char *ops_arg = NULL, *replay = NULL, *regressions = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE()                                                                                 \
    do {                                                                                             \
        if (v == NULL) {                                                                             \
            fprintf(stderr, "moe-fuzz: %s needs a value (see --help)\n", a);                         \
            return 2;                                                                                \
        }                                                                                            \
        i++;                                                                                         \
    } while (0)
        char *end = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--list") == 0) {
            for (const pt_op *op = pt_ops; op->name; op++)
                printf("%-14s %-5s %s\n", op->name, op->cuda ? "cuda" : "ref", op->help);
            return 0;
        } else if (strcmp(a, "--seconds") == 0) {
            NEED_VALUE();
            seconds = strtod(v, &end);
            if (*end || !(seconds > 0)) {
                fprintf(stderr, "moe-fuzz: --seconds needs a positive number, got '%s'\n", v);
                return 2;
            }
        } else if (strcmp(a, "--cases") == 0) {
            NEED_VALUE();
            cases = strtol(v, &end, 10);
            if (*end || cases < 1) {
                fprintf(stderr, "moe-fuzz: --cases needs a positive integer, got '%s'\n", v);
                return 2;
            }
        } else if (strcmp(a, "--seed") == 0) {
            NEED_VALUE();
            if (parse_seed(v, &seed) != 0) {
                fprintf(stderr, "moe-fuzz: --seed needs an integer (decimal or 0x hex), got '%s'\n", v);
                return 2;
            }
            have_seed = 1;
        } else if (strcmp(a, "--ops") == 0) {
            NEED_VALUE();
            ops_arg = v;
        } else if (strcmp(a, "--backend") == 0) {
            NEED_VALUE();
            if (strcmp(v, "ref") == 0)
                f.backend = MOE_BACKEND_REF;
            else if (strcmp(v, "cuda") == 0)
                f.backend = MOE_BACKEND_CUDA;
            else {
                fprintf(stderr, "moe-fuzz: --backend is ref or cuda, got '%s'\n", v);
                return 2;
            }
        } else if (strcmp(a, "--max-size") == 0) {
            NEED_VALUE();
            f.max_size = (int)strtol(v, &end, 10);
            if (*end || f.max_size < 0 || f.max_size > PT_MAX_SIZE) {
                fprintf(stderr, "moe-fuzz: --max-size needs an integer in 0..%d, got '%s'\n", PT_MAX_SIZE, v);
                return 2;
            }
        } else if (strcmp(a, "--shrink-seconds") == 0) {
            NEED_VALUE();
            f.shrink_seconds = strtod(v, &end);
            if (*end || !(f.shrink_seconds >= 0)) {
                fprintf(stderr, "moe-fuzz: --shrink-seconds needs a number >= 0, got '%s'\n", v);
                return 2;
            }
        } else if (strcmp(a, "--timeout") == 0) {
            NEED_VALUE();
            f.timeout_s = (int)strtol(v, &end, 10);
            if (*end || f.timeout_s < 1) {
                fprintf(stderr, "moe-fuzz: --timeout needs a positive number of seconds, got '%s'\n", v);
                return 2;
            }
        } else if (strcmp(a, "--regressions") == 0) {
            NEED_VALUE();
            regressions = v;
        } else if (strcmp(a, "--replay") == 0) {
            NEED_VALUE();
            replay = v;
        } else if (strcmp(a, "--no-fork") == 0) {
            f.no_fork = 1;
        } else {
            fprintf(stderr, "moe-fuzz: unknown argument '%s' (see --help)\n", a);
            return 2;
        }
#undef NEED_VALUE
    }
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    char tmpl[] = "/tmp/moe-fuzz-stderr-XXXXXX";
    f.err_fd = mkstemp(tmpl);
    if (f.err_fd < 0) {
        perror("moe-fuzz: mkstemp");
        return 2;
    }
    unlink(tmpl);

    /* a replayed gpu op implies the cuda backend */
    if (replay) {
        const char *colon = strchr(replay, ':');
        char name[64];
        if (colon && (size_t)(colon - replay) < sizeof name) {
            memcpy(name, replay, (size_t)(colon - replay));
            name[colon - replay] = '\0';
            const pt_op *op = pt_find_op(name);
            if (op && op->cuda)
                f.backend = MOE_BACKEND_CUDA;
        }
    }
    if (f.backend == MOE_BACKEND_CUDA) {
        int any = 0;
        for (const pt_op *op = pt_ops; op->name; op++)
            any |= op->cuda;
        if (!any || !cuda_usable()) {
            printf("moe-fuzz: SKIP: %s\n", any ? "no usable CUDA device" : "libmoe's moe-fuzz was built without CUDA");
            return 77;
        }
    }
    if (replay) {
        const int rc = replay_line(&f, replay, 1, NULL, 0);
        worker_stop(&f, 0);
        return rc == -2 ? 2 : rc == -1 ? (fprintf(stderr, "moe-fuzz: that op needs --backend %s\n",
                                                   f.backend == MOE_BACKEND_CUDA ? "ref" : "cuda"), 2)
                                       : rc;
    }

    /* the ops of this run */
    op_stats stats[64];
    int nops = 0;
    for (const pt_op *op = pt_ops; op->name; op++) {
        if ((op->cuda != 0) != (f.backend == MOE_BACKEND_CUDA))
            continue;
        if (ops_arg) {
            const size_t len = strlen(op->name);
            const char *p = ops_arg;
            int listed = 0;
            while (*p) {
                const char *comma = strchr(p, ',');
                const size_t l = comma ? (size_t)(comma - p) : strlen(p);
                listed |= l == len && strncmp(p, op->name, len) == 0;
                p += l + (comma != NULL);
            }
            if (!listed)
                continue;
        }
        memset(&stats[nops], 0, sizeof stats[nops]);
        stats[nops++].op = op_index(op);
    }
    if (ops_arg) { /* every listed name must exist */
        const char *p = ops_arg;
        while (*p) {
            const char *comma = strchr(p, ',');
            const size_t l = comma ? (size_t)(comma - p) : strlen(p);
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(l < 63 ? l : 63), p);
            const pt_op *op = pt_find_op(name);
            if (op == NULL || (op->cuda != 0) != (f.backend == MOE_BACKEND_CUDA)) {
                fprintf(stderr, "moe-fuzz: --ops: '%s' is not an op of backend %s (--list names them)\n", name,
                        f.backend == MOE_BACKEND_CUDA ? "cuda" : "ref");
                return 2;
            }
            p += l + (comma != NULL);
        }
    }
    if (!have_seed)
        seed = pt_mix((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32));
    printf("moe-fuzz: seed 0x%" PRIx64 " (replay this run with --seed 0x%" PRIx64 ")\n", seed, seed);
    printf("moe-fuzz: backend %s, %d ops, %s, max size %d\n", f.backend == MOE_BACKEND_CUDA ? "cuda" : "ref", nops,
           cases ? "fixed case count" : "time budget", f.max_size);
    if (cases)
        printf("moe-fuzz: %ld cases per op\n", cases);
    else
        printf("moe-fuzz: %.0f s\n", seconds);

    long failures = 0;
    const double start = now();
    if (regressions) {
        FILE *rf = fopen(regressions, "r");
        if (rf == NULL) {
            fprintf(stderr, "moe-fuzz: cannot open --regressions %s: %s\n", regressions, strerror(errno));
            return 2;
        }
        char *line = NULL;
        size_t cap = 0;
        long replayed = 0, skipped = 0, failed = 0, lineno = 0;
        while (getline(&line, &cap, rf) > 0) {
            lineno++;
            char *p = line;
            while (*p == ' ' || *p == '\t')
                p++;
            if (*p == '#' || *p == '\n' || *p == '\0')
                continue;
            char *stop = p;
            while (*stop && *stop != ' ' && *stop != '\t' && *stop != '\n' && *stop != '#')
                stop++;
            *stop = '\0';
            const int rc = replay_line(&f, p, 0, stats, nops);
            if (rc == -2) {
                fprintf(stderr, "moe-fuzz: %s:%ld: not a reproducer\n", regressions, lineno);
                return 2;
            }
            if (rc == -1) {
                skipped++;
                continue;
            }
            replayed++;
            if (rc == 1) {
                printf("  (regression %s:%ld)\n", regressions, lineno);
                failed++;
            }
        }
        free(line);
        fclose(rf);
        failures += failed;
        printf("moe-fuzz: regressions: %ld replayed, %ld failed, %ld for the other backend (%.1f s)\n", replayed, failed,
               skipped, now() - start);
    }

    /* the fuzz loop: ops in turn */
    const double fuzz_start = now();
    double last_progress = fuzz_start;
    const int tty = isatty(STDOUT_FILENO);
    long total = 0;
    int active = nops;
    long *done = xcalloc((size_t)nops + 1, sizeof(long));
    int *retired = xcalloc((size_t)nops + 1, sizeof(int));
    int size = 0;
    for (long round = 0; active > 0; round++) {
        for (int i = 0; i < nops; i++) {
            if (retired[i])
                continue;
            const double elapsed = now() - fuzz_start;
            if (cases ? done[i] >= cases : elapsed >= seconds) {
                retired[i] = 1, active--;
                continue;
            }
            if (cases) {
                size = (int)(done[i] * (f.max_size + 1) / cases);
            } else {
                const double frac = elapsed / seconds;
                size = frac < 0.5 ? (int)(frac * 2 * f.max_size) : (int)((round * 37 + i) % (f.max_size + 1));
            }
            const uint64_t case_seed = pt_mix(seed ^ pt_mix(((uint64_t)stats[i].op << 40) + (uint64_t)done[i]));
            case_result r;
            evaluate(&f, stats[i].op, size, 1, case_seed, NULL, 0, &r);
            done[i]++, total++;
            record_case(&stats[i], &r);
            if (r.outcome == PT_FAIL) {
                if (stats[i].failures < MAX_REPORTED_FAILURES)
                    stats[i].repro[stats[i].failures] = report_failure(&f, &stats[i], size, case_seed, &r, 1);
                stats[i].failures++, failures++;
                if (stats[i].failures >= MAX_REPORTED_FAILURES) {
                    printf("moe-fuzz: %s failed %d times; it leaves this run\n", op_at(stats[i].op)->name,
                           MAX_REPORTED_FAILURES);
                    retired[i] = 1, active--;
                }
            }
            result_free(&r);
            const double t = now();
            if (t - last_progress >= (tty ? 0.5 : 10.0)) {
                printf("%s[%6.1f s] %ld cases (%.1f/s), size %d, failures %ld%s", tty ? "\r" : "", t - fuzz_start, total,
                       (double)total / (t - fuzz_start), size, failures, tty ? "   " : "\n");
                fflush(stdout);
                last_progress = t;
            }
        }
    }
    worker_stop(&f, 0);
    const double took = now() - start;
    printf("%s\nmoe-fuzz: %ld cases in %.1f s (%.1f/s), seed 0x%" PRIx64 "\n\n", tty ? "" : "", total, took,
           (double)total / (took > 0 ? took : 1), seed);
    printf("%-14s %8s %10s %16s %9s\n", "op", "cases", "discarded", "worst err/bound", "failures");
    for (int i = 0; i < nops; i++)
        printf("%-14s %8ld %10ld %16.4g %9ld\n", op_at(stats[i].op)->name, stats[i].cases, stats[i].discards,
               stats[i].worst, stats[i].failures);
    if (failures) {
        printf("\nreproducers (shrunk):\n");
        for (int i = 0; i < nops; i++)
            for (long j = 0; j < stats[i].failures && j < MAX_REPORTED_FAILURES; j++)
                printf("  proptest/moe-fuzz --replay %s\n", stats[i].repro[j]);
    }
    for (int i = 0; i < nops; i++)
        for (long j = 0; j < stats[i].failures && j < MAX_REPORTED_FAILURES; j++)
            free(stats[i].repro[j]);
    free(done);
    free(retired);
    printf("\nmoe-fuzz: %s\n", failures ? "FAILED" : "all properties held");
    return failures ? 1 : 0;
}
