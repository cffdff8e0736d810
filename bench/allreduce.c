/*
 * allreduce.c - loom's all-reduce across the processes of an MPI job (loom_group_mpi_new: the
 * fixed-order reduction, bitwise repeatable) against OpenMPI's own MPI_Allreduce (MPI_SUM,
 * whichever algorithm it picks, not bitwise repeatable across process counts), at the sizes of
 * gradient buckets, loom's on buffers from loom_group_alloc (on one machine, memory the processes
 * share: the all-reduce works in place, as the devices' gradients are) and on malloc'ed ones
 * (through MPI). Median of REPS timed calls after warm-up calls; bus bandwidth as NCCL counts it,
 * 2 (P - 1) / P x bytes / time. Built as build/bench_allreduce where MPI is found; run as
 *   mpirun -np 2 build/bench_allreduce
 */
#include "loom.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define REPS 50

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    loom_group *g = loom_group_mpi_new(60); /* initialises MPI */
    if (!g) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    loom_comm *c = loom_group_comm(g, rank);
    if (rank == 0)
        printf("%-10s %14s %14s %14s %10s   (%d processes; median of %d)\n", "bytes", "loom GB/s",
               "loom_malloc", "MPI GB/s", "loom/MPI", world, REPS);
    int64_t sizes[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int64_t n = sizes[s] / 4;
        float *shared = loom_group_alloc(g, sizeof(float) * (size_t)n),
              *plain = malloc(sizeof(float) * (size_t)n);
        double tl[REPS], tp[REPS], tm[REPS];
        for (int r = -5; r < REPS; r++) {
            for (int64_t i = 0; i < n; i++)
                shared[i] = plain[i] = (float)(i % 7) + rank;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            loom_comm_allreduce(c, shared, n, LOOM_REDUCE_SUM);
            double t1 = MPI_Wtime();
            MPI_Barrier(MPI_COMM_WORLD);
            double t2 = MPI_Wtime();
            loom_comm_allreduce(c, plain, n, LOOM_REDUCE_SUM);
            double t3 = MPI_Wtime();
            MPI_Barrier(MPI_COMM_WORLD);
            double t4 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, plain, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double t5 = MPI_Wtime();
            if (r >= 0)
                tl[r] = t1 - t0, tp[r] = t3 - t2, tm[r] = t5 - t4;
        }
        qsort(tl, REPS, sizeof *tl, cmp);
        qsort(tp, REPS, sizeof *tp, cmp);
        qsort(tm, REPS, sizeof *tm, cmp);
        double bus = 2.0 * (world - 1) / world * (double)sizes[s] / 1e9;
        if (rank == 0)
            printf("%-10lld %14.2f %14.2f %14.2f %9.2fx\n", (long long)sizes[s], bus / tl[REPS / 2],
                   bus / tp[REPS / 2], bus / tm[REPS / 2], tm[REPS / 2] / tl[REPS / 2]);
        loom_group_release(g, shared, sizeof(float) * (size_t)n);
        free(plain);
    }
    loom_group_free(g);
    return 0;
}
