/*
 * ref/ref_threads.h: the OpenMP team helpers and the float copy shared by ref/gemm/ and ref/mlp/
 * (static inline: each file gets its own copy, with the same contracts).
 *
 * OpenMP vs Frama-C.  Built with OpenMP (_OPENMP defined), team_size and team_member are
 * omp_get_max_threads() and omp_get_thread_num(); their contracts there are the OpenMP specification's
 * promise (a team size >= 1; a thread number below the team size, which num_threads(threads) bounds by
 * threads), not proved.  Frama-C's preprocessing does not define _OPENMP (it ignores the OpenMP pragmas
 * too, so a parallel region is a plain block run by thread 0): it parses the other branch, 1 and 0, and
 * WP proves the contracts of that branch.  They are proved once, in ref/gemm/setup.c's run of
 * specs/verify.sh (a function of a header is proved in the run of a file that includes it); the runs of
 * the other files use the same contracts at their call sites.
 */
#ifndef MOE_REF_THREADS_H
#define MOE_REF_THREADS_H

#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The OpenMP thread count of the next parallel region (omp_get_max_threads() >= 1); 1 without OpenMP,
 * which is what Frama-C parses: WP proves the contract of that branch only. */
/*@ terminates \true;
    assigns \nothing;
    ensures positive: \result >= 1; */
static inline int team_size(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* This thread's number in a parallel region opened with num_threads(threads): omp_get_thread_num(), below
 * the team size, which num_threads bounds by threads (the OpenMP specification's promise, not proved); 0
 * without OpenMP (Frama-C's parse, proved). */
/*@ requires threads: threads >= 1;
    terminates \true;
    assigns \nothing;
    ensures member: 0 <= \result < threads; */
static inline int team_member(int threads)
{
    (void)threads;
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* dst[0 .. count) = src[0 .. count).  Contract trusted, not proved: WP's typed model cannot follow
 * memcpy's casts of float * to char *. */
/*@ requires count: 0 <= count;
    requires dst: \valid(dst + (0 .. count - 1));
    requires src: \valid_read(src + (0 .. count - 1));
    requires separated: \separated(dst + (0 .. count - 1), src + (0 .. count - 1));
    terminates \true;
    assigns dst[0 .. count - 1]; */
static inline void copy_floats(float *dst, const float *src, int64_t count)
{
    memcpy(dst, src, (size_t)count * sizeof *dst);
}

#endif
