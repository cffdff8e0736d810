/*
 * dist/internal.h - the collective interface behind loom_comm_*: a group is a table of
 * operations and the state of one implementation, `local` (ranks are threads of this process,
 * comm.c) or `mpi` (ranks are processes of an MPI job, mpi.c). Everything above dist calls the
 * public loom_comm_* functions and never knows which one runs. Never installed.
 *
 * Both implementations reduce the same way (each rank reduces 1/world of the elements, adding
 * ranks 0..world-1 in order, loom__reduce_slice), so results are bitwise identical on every rank,
 * from run to run, and between a local group and an MPI group of the same world.
 */
#ifndef LOOM_DIST_INTERNAL_H
#define LOOM_DIST_INTERNAL_H

#include "../core/internal.h"

#include <stdatomic.h>

typedef struct {
    const char *name; /* "local", "mpi" */
    loom_status (*allreduce)(loom_comm *c, float *buf, int64_t n, loom_reduce_op op);
    loom_status (*broadcast)(loom_comm *c, float *buf, int64_t n, int root);
    loom_status (*allgather)(loom_comm *c, const float *in, int64_t n, float *out);
    loom_status (*barrier)(loom_comm *c);
    void (*abort)(loom_comm *c, const char *reason);
    void (*free)(loom_group *g);
    /* memory that this group's all-reduce reads in place from the other ranks (NULL: none
     * needed, any memory will do, or none to be had), and its release */
    void *(*shared)(loom_group *g, size_t bytes);
    bool (*unshare)(loom_group *g, void *p, size_t bytes); /* false: not this memory */
} loom__group_ops;

/* What every group starts with; an implementation's state follows in its own struct. */
typedef struct {
    const loom__group_ops *ops;
    int world;
    double timeout; /* seconds a rank waits in a collective */
} loom__group_head;

struct loom_comm {
    loom_group *g;
    int rank;
    atomic_uint_fast64_t seq; /* collectives entered (read by watchdogs on other threads) */
    uint64_t barriers;
};

/* Elements [lo, hi) of the rows p[0..w) set, in every row, to their sum over rows 0..w-1 in
 * order (divided by w for a mean): the one reduction of every implementation. */
void loom__reduce_slice(float *const *p, int w, int64_t lo, int64_t hi, bool mean);
/* Rank `rank`'s share [lo, hi) of n elements split over world ranks. */
void loom__slice(int64_t n, int world, int rank, int64_t *lo, int64_t *hi);

/* loom__group_ops.shared and unshare of g: NULL where it has none (any memory will do) */
void *loom__group_shared(loom_group *g, size_t bytes);
bool loom__group_unshare(loom_group *g, void *p, size_t bytes); /* false: not g's memory */

/* shm.c: segments of memory that the processes of one machine (rank of size) all map, named
 * after `job`; see there. new creates this process's, attach (once every rank has created its
 * own) maps the others', unlink (once every rank has attached) removes the files. */
typedef struct loom__shm loom__shm;
loom__shm *loom__shm_new(const char *job, int rank, int size);
loom_status loom__shm_attach(loom__shm *n, const char *job);
void loom__shm_unlink(loom__shm *n);
void loom__shm_free(loom__shm *n);
/* A buffer in this process's segment (NULL when it is full or /dev/shm is), and its release. */
void *loom__shm_alloc(loom__shm *n, size_t bytes);
bool loom__shm_release(loom__shm *n, void *p, size_t bytes); /* false: not in it */
/* Every rank's buf (count floats) set to the sum over ranks in order (a mean: divided by the
 * ranks), read and written in place; false, with nothing done on any rank, unless every rank's
 * buf lies in its segment. A collective of all the node's ranks, with no deadline of its own. */
bool loom__shm_allreduce(loom__shm *n, float *buf, int64_t count, bool mean);

/* mpi.c: an MPI group; with `node`, its processes all on one machine share memory (shm.c) */
loom_group *loom__group_mpi(double timeout_s, bool node);
/* mpi.c: this process's handle of an MPI group (NULL for another rank's: it lives elsewhere), and
 * the MPI library's name and version (NULL when built without MPI). */
loom_comm *loom__mpi_comm(loom_group *g, int rank);
loom_comm *loom__mpi_self(loom_group *g); /* this process's handle */
/* This process's rank among the group's processes on its machine, and how many those are. */
void loom__mpi_node(const loom_group *g, int *rank, int *size);
const char *loom__mpi_version(void);

#endif
