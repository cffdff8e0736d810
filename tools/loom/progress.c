/*
 * progress.c - the training commands' progress. On a terminal, one bar redrawn in place (at most
 * ten times a second and at each epoch's end): epoch, step of the epoch, samples (or tokens) a
 * second, the share of the FMA peak the step's products reach (nanoGPT's MFU), loss and the
 * time left; a line of its own (an evaluation) clears the bar first and the bar comes back after
 * it. Not on a terminal, one plain line every N steps (100 for the recipes) and at each epoch's
 * end; --quiet, none.
 */
#include "cli.h"

#include <stdarg.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_progress_init(cli_progress *p, bool quiet, const char *unit, int64_t plain_every) {
    memset(p, 0, sizeof *p);
    p->quiet = quiet, p->plain_every = plain_every;
    p->tty = !quiet && isatty(STDOUT_FILENO);
    p->unit = unit;
    p->peak = p->tty ? loom_fma_peak_gflops() : 0; /* (before any step: the cores are idle) */
    p->started = now();
}

/* h:mm:ss or m:ss of s seconds. */
static void clock_str(double s, char *b, size_t n) {
    int t = s > 0 && s < 1e7 ? (int)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(b, n, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(b, n, "%d:%02d", t / 60, t % 60);
}

static void draw(cli_progress *p, const cli_step *s) {
    struct winsize ws;
    int cols = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 40 ? ws.ws_col : 100;
    int bar = cols >= 120 ? 30 : cols >= 100 ? 20 : 10, filled = 0;
    if (s->of > 0)
        filled = (int)((double)bar * (double)s->i / (double)s->of);
    char b[64], eta[40], mfu[40] = "";
    for (int k = 0; k < bar; k++)
        b[k] = k < filled ? '#' : '.';
    b[bar] = 0;
    double per = (now() - p->started) / (double)(s->step - p->first_step + 1);
    clock_str(per * (double)(s->total - s->step), eta, sizeof eta);
    if (p->peak > 0 && s->flops > 0 && s->seconds > 0)
        snprintf(mfu, sizeof mfu, " %4.1f%% of peak",
                 100 * s->flops / s->seconds / (p->peak * 1e9));
    char line[512];
    int n = snprintf(line, sizeof line, "%s [%s] %lld/%lld %.0f %s/s%s loss %.4f ETA %s", s->label,
                     b, (long long)s->i, (long long)s->of, s->rate, p->unit, mfu, s->loss, eta);
    if (n > cols - 1)
        line[cols - 1] = 0;
    printf("\r%s\033[K", line);
    fflush(stdout);
    p->shown = true;
}

void cli_progress_step(cli_progress *p, const cli_step *s) {
    if (p->quiet)
        return;
    if (!p->steps++)
        p->first_step = s->step, p->started = now();
    if (!p->tty) {
        bool crossed = p->plain_every > 0 &&
                       (s->i / p->plain_every != p->last_i / p->plain_every || s->i < p->last_i);
        p->last_i = s->i;
        if (p->plain_every > 0 && (crossed || s->i == s->of || s->step == s->total)) {
            printf("%s step %lld/%lld loss %.4f %.0f %s/s\n", s->label, (long long)s->i,
                   (long long)s->of, s->loss, s->rate, p->unit);
            fflush(stdout);
        }
        return;
    }
    double t = now();
    if (t - p->drawn >= 0.1 || s->i == s->of || s->step == s->total)
        draw(p, s), p->drawn = t;
}

void cli_progress_line(cli_progress *p, const char *fmt, ...) {
    if (p->shown)
        printf("\r\033[K"), p->shown = false;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void cli_progress_end(cli_progress *p) {
    if (p->shown)
        printf("\r\033[K"), p->shown = false;
    fflush(stdout);
}
