/*
 * plot.c - `loom plot LOGDIR [-o FILE.svg] [--log-scale]`: the training loss, the validation loss
 * and the accuracy of a run's metrics.csv against its step, drawn as one self-contained SVG file
 * (no script, no font files): a loss panel (a log scale with --log-scale) and, when the log has
 * accuracies, an accuracy panel below it, each with axes, ticks at round values and a legend.
 * Every logged value is one point of its series' polyline (id "train_loss", "val_loss",
 * "val_accuracy"), in the order of the rows. The columns are found by their header's names, so
 * both the recipes' log and shakespeare-gpt's are read.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { TRAIN, VAL, ACC, NSERIES };

typedef struct {
    double *x, *y;
    int64_t n, cap;
} series;

static int push(series *s, double x, double y) {
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, sizeof(double) * (size_t)cap);
        double *ny = nx ? realloc(s->y, sizeof(double) * (size_t)cap) : NULL;
        if (nx)
            s->x = nx;
        if (!ny)
            return cli_fail("plot: out of memory");
        s->y = ny, s->cap = cap;
    }
    s->x[s->n] = x, s->y[s->n++] = y;
    return 0;
}

/* The index of column `name` in the header's comma-separated names (-1: none). */
static int column(const char *header, const char *name) {
    int i = 0;
    size_t n = strlen(name);
    for (const char *c = header; c; c = strchr(c, ','), c = c ? c + 1 : NULL, i++)
        if (!strncmp(c, name, n) && (c[n] == ',' || c[n] == '\n' || c[n] == '\r' || !c[n]))
            return i;
    return -1;
}

/* Field i of a CSV row as a number into *v; false when it is empty or not one. */
static bool field(const char *row, int i, double *v) {
    if (i < 0)
        return false;
    for (; i > 0 && row; i--)
        row = strchr(row, ','), row = row ? row + 1 : NULL;
    if (!row || *row == ',' || *row == '\n' || !*row)
        return false;
    char *end;
    errno = 0;
    *v = strtod(row, &end);
    return end != row && !errno && isfinite(*v) && (*end == ',' || *end == '\n' || !*end);
}

/* The series of path's metrics.csv: the training loss of the step rows, the validation loss and
 * accuracy of the evaluation rows. 0, or 1 after one line naming the file and line. */
static int read_log(const char *path, series *s) {
    FILE *f = fopen(path, "r");
    if (!f)
        return cli_fail("plot: cannot read '%s': %s", path, strerror(errno));
    char line[1024];
    if (!fgets(line, sizeof line, f) || column(line, "step") != 0) {
        fclose(f);
        return cli_fail("plot: '%s' line 1: expected a metrics.csv header starting with 'step'",
                        path);
    }
    int loss = column(line, "loss");
    int val = column(line, "val_loss") >= 0 ? column(line, "val_loss") : column(line, "test_loss");
    int acc = column(line, "test_accuracy");
    int64_t lineno = 1;
    int rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        double step, v;
        lineno++;
        if (!field(line, 0, &step)) {
            rc = cli_fail("plot: '%s' line %lld: expected a step number first", path,
                          (long long)lineno);
            break;
        }
        bool eval = false; /* (an evaluation's row repeats the epoch's last loss: not drawn) */
        if (field(line, val, &v))
            eval = true, rc = push(&s[VAL], step, v);
        if (!rc && field(line, acc, &v))
            eval = true, rc = push(&s[ACC], step, v);
        if (!rc && !eval && field(line, loss, &v))
            rc = push(&s[TRAIN], step, v);
    }
    fclose(f);
    if (!rc && s[TRAIN].n + s[VAL].n + s[ACC].n == 0)
        rc = cli_fail("plot: '%s' holds no values to draw", path);
    return rc;
}

/* A round tick step for a range: 1, 2 or 5 times a power of ten, about six ticks. */
static double tick_step(double span) {
    double raw = span / 6, p = pow(10, floor(log10(raw))), r = raw / p;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * p;
}

typedef struct {
    double x0, x1, y0, y1;  /* the data's range */
    double left, top, w, h; /* the panel's plot area on the page */
    bool log;
} panel;

static double px(const panel *p, double x) {
    return p->left + (x - p->x0) / (p->x1 - p->x0) * p->w;
}
static double py(const panel *p, double y) {
    double a = p->log ? log10(p->y0) : p->y0, b = p->log ? log10(p->y1) : p->y1;
    double v = p->log ? log10(y) : y;
    return p->top + p->h - (v - a) / (b - a) * p->h;
}

/* Axes, ticks and grid of panel p, its title, into f. */
static void axes(FILE *f, const panel *p, const char *title) {
    fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' stroke='#444'/>\n",
            p->left, p->top, p->w, p->h);
    fprintf(f, "<text x='%.1f' y='%.1f' font-size='14' font-weight='bold'>%s</text>\n", p->left,
            p->top - 8, title);
    double dx = tick_step(p->x1 - p->x0);
    for (double x = ceil(p->x0 / dx) * dx; x <= p->x1 + 1e-9 * dx; x += dx)
        fprintf(f,
                "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>"
                "<text x='%.1f' y='%.1f' font-size='11' text-anchor='middle'>%g</text>\n",
                px(p, x), p->top, px(p, x), p->top + p->h, px(p, x), p->top + p->h + 15, x);
    if (p->log) {
        for (double e = floor(log10(p->y0)); e <= ceil(log10(p->y1)); e++)
            for (int m = 1; m <= 9; m += m == 1 ? 1 : 3) { /* 1, 2, 5 of each decade */
                double y = m * pow(10, e);
                if (y < p->y0 * (1 - 1e-9) || y > p->y1 * (1 + 1e-9))
                    continue;
                fprintf(f,
                        "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>"
                        "<text x='%.1f' y='%.1f' font-size='11' text-anchor='end'>%g</text>\n",
                        p->left, py(p, y), p->left + p->w, py(p, y), p->left - 5, py(p, y) + 4, y);
            }
        return;
    }
    double dy = tick_step(p->y1 - p->y0);
    for (double y = ceil(p->y0 / dy) * dy; y <= p->y1 + 1e-9 * dy; y += dy)
        fprintf(f,
                "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>"
                "<text x='%.1f' y='%.1f' font-size='11' text-anchor='end'>%g</text>\n",
                p->left, py(p, y), p->left + p->w, py(p, y), p->left - 5, py(p, y) + 4, y);
}

static void polyline(FILE *f, const panel *p, const series *s, const char *id, const char *color,
                     bool dots) {
    if (s->n == 0)
        return;
    fprintf(f, "<polyline id='%s' fill='none' stroke='%s' stroke-width='1.5' points='", id, color);
    for (int64_t i = 0; i < s->n; i++)
        fprintf(f, "%s%.2f,%.2f", i ? " " : "", px(p, s->x[i]), py(p, s->y[i]));
    fprintf(f, "'/>\n");
    for (int64_t i = 0; dots && i < s->n; i++)
        fprintf(f, "<circle cx='%.2f' cy='%.2f' r='3' fill='%s'/>\n", px(p, s->x[i]),
                py(p, s->y[i]), color);
}

static void legend(FILE *f, const panel *p, int row, const char *color, const char *name) {
    double x = p->left + p->w - 150, y = p->top + 16 + 18 * row;
    fprintf(f,
            "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s' stroke-width='2'/>"
            "<text x='%.1f' y='%.1f' font-size='12'>%s</text>\n",
            x, y - 4, x + 24, y - 4, color, x + 30, y, name);
}

/* The range of the series given (x over every one of them) into p. */
static void range(panel *p, const series *s, int from, int to, const series *all) {
    p->x0 = INFINITY, p->x1 = -INFINITY, p->y0 = INFINITY, p->y1 = -INFINITY;
    for (int k = 0; k < NSERIES; k++)
        for (int64_t i = 0; i < all[k].n; i++)
            p->x0 = fmin(p->x0, all[k].x[i]), p->x1 = fmax(p->x1, all[k].x[i]);
    for (int k = from; k <= to; k++)
        for (int64_t i = 0; i < s[k].n; i++)
            if (!p->log || s[k].y[i] > 0)
                p->y0 = fmin(p->y0, s[k].y[i]), p->y1 = fmax(p->y1, s[k].y[i]);
    if (!(p->x1 > p->x0))
        p->x0 -= 1, p->x1 += 1;
    if (!(p->y1 > p->y0))
        p->y0 = p->log ? p->y0 / 2 : p->y0 - 0.5, p->y1 = p->log ? p->y1 * 2 : p->y1 + 0.5;
    else if (!p->log) {
        double pad = 0.05 * (p->y1 - p->y0);
        p->y0 -= pad, p->y1 += pad;
    }
}

static int draw(const char *out, const series *s, bool log_scale) {
    bool accs = s[ACC].n > 0;
    double width = 820, height = accs ? 640 : 380;
    panel loss = {.left = 70, .top = 40, .w = width - 100, .h = 280, .log = log_scale};
    panel acc = {.left = 70, .top = 380, .w = width - 100, .h = 200};
    for (int k = TRAIN; log_scale && k <= VAL; k++)
        for (int64_t i = 0; i < s[k].n; i++)
            if (!(s[k].y[i] > 0))
                return cli_fail("plot: --log-scale: the loss %g at step %g has no place on it",
                                s[k].y[i], s[k].x[i]);
    range(&loss, s, TRAIN, VAL, s);
    range(&acc, s, ACC, ACC, s);
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%.4200s.tmp", out);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return cli_fail("plot: cannot write '%s': %s", out, strerror(errno));
    fprintf(f,
            "<?xml version='1.0' encoding='UTF-8'?>\n<svg xmlns='http://www.w3.org/2000/svg' "
            "width='%.0f' height='%.0f' viewBox='0 0 %.0f %.0f' font-family='sans-serif'>\n"
            "<rect width='100%%' height='100%%' fill='white'/>\n",
            width, height, width, height);
    axes(f, &loss, log_scale ? "loss (log scale)" : "loss");
    polyline(f, &loss, &s[TRAIN], "train_loss", "#1f77b4", false);
    polyline(f, &loss, &s[VAL], "val_loss", "#d62728", true);
    legend(f, &loss, 0, "#1f77b4", "training loss");
    legend(f, &loss, 1, "#d62728", "validation loss");
    if (accs) {
        axes(f, &acc, "validation accuracy");
        polyline(f, &acc, &s[ACC], "val_accuracy", "#2ca02c", true);
        legend(f, &acc, 0, "#2ca02c", "accuracy");
    }
    fprintf(f, "<text x='%.1f' y='%.1f' font-size='12' text-anchor='middle'>step</text>\n</svg>\n",
            width / 2, height - 8);
    bool ok = !ferror(f);
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, out) != 0) {
        int err = errno;
        remove(tmp);
        return cli_fail("plot: cannot write '%s': %s", out, strerror(err));
    }
    return 0;
}

int cli_plot(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    bool log_scale = false;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--log-scale"))
            log_scale = true;
        else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (i + 1 >= argc || !*argv[i + 1])
                return cli_fail("plot: %s: expected a file path", argv[i]), 2;
            out = argv[++i];
        } else if (argv[i][0] == '-')
            return cli_fail("plot: unknown option '%s' (see loom plot --help)", argv[i]), 2;
        else if (!dir)
            dir = argv[i];
        else
            return cli_fail("plot: unexpected argument '%s' (one log directory)", argv[i]), 2;
    }
    if (!dir)
        return cli_fail("plot: expected a log directory (a run's --log-dir)"), 2;
    char csv[4200], svg[4200];
    snprintf(csv, sizeof csv, "%s/metrics.csv", dir);
    snprintf(svg, sizeof svg, "%s/metrics.svg", dir);
    series s[NSERIES] = {{0}};
    int rc = read_log(csv, s);
    if (!rc)
        rc = draw(out ? out : svg, s, log_scale);
    if (!rc)
        printf("wrote %s: %lld training losses, %lld validation losses, %lld accuracies\n",
               out ? out : svg, (long long)s[TRAIN].n, (long long)s[VAL].n, (long long)s[ACC].n);
    for (int k = 0; k < NSERIES; k++)
        free(s[k].x), free(s[k].y);
    return rc;
}
