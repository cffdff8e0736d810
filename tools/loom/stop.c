/*
 * stop.c - SIGINT and SIGTERM for every training command (`loom train` of the recipes and of
 * shakespeare-gpt): the first one is caught and the loop stops at the next step boundary, the
 * step running ends, every file is left whole, and the command exits 128 + the signal; a second
 * one ends the process at once (the default action). Across the processes of an MPI job they
 * stop together, at the same step (loom_devices_any).
 */
#include "cli.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile sig_atomic_t stop_signal; /* as the handler set it */
static loom_devices *agreeing;            /* across processes: they stop together */
static int agreed; /* across processes: the stop as of the last cli_stopping */

static void on_stop(int sig) {
    stop_signal = sig;
}

void cli_catch_stop(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

void cli_stop_agree(loom_devices *d) {
    agreeing = d;
}

/* Whether the processes of an MPI job decide together. */
static bool across(void) {
    return agreeing && loom_devices_world(agreeing) > loom_devices_count(agreeing);
}

bool cli_stopping(void) {
    if (!across())
        return stop_signal != 0;
    int mine = stop_signal; /* (read once: the handler may set it meanwhile) */
    if (!agreed && loom_devices_any(agreeing, mine != 0))
        agreed = mine ? mine : SIGTERM;
    return agreed != 0;
}

/* Across processes the signal counts from the cli_stopping call that agreed on it, so that a
 * signal landing between two of them cannot make one process skip what the others do. */
int cli_stop_signal(void) {
    return across() ? agreed : stop_signal;
}

const char *cli_stop_name(void) {
    return cli_stop_signal() == SIGINT ? "SIGINT" : "SIGTERM";
}

int cli_stop_report(bool writer, int64_t step, const char *ckpt, const char *dir,
                    const char *otherwise) {
    if (writer && dir)
        fprintf(stderr,
                "loom: stopped by %s after step %lld: checkpoint %s written; continue with "
                "--resume %s\n",
                cli_stop_name(), (long long)step, ckpt, dir);
    else if (writer)
        fprintf(stderr, "loom: stopped by %s after step %lld: %s\n", cli_stop_name(),
                (long long)step, otherwise);
    return 128 + cli_stop_signal();
}
