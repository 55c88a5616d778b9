/*
 * pause: the process that holds a pod sandbox's namespaces.
 *
 * It does nothing but wait: children (processes that end up re-parented to it when it is
 * PID 1 of a shared PID namespace) are reaped on SIGCHLD, SIGTERM and SIGINT make it exit 0,
 * and otherwise it sleeps in pause() forever. Built with `musl-gcc -static -Os` so the image
 * needs no libc.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig)
{
    (void)sig;
    _exit(0);
}

static void on_child(int sig)
{
    int saved = errno;
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    errno = saved;
}

static int handle(int sig, void (*fn)(int), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

int main(void)
{
    if (handle(SIGTERM, on_stop, 0) != 0 || handle(SIGINT, on_stop, 0) != 0 ||
        handle(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) != 0)
        return 1;
    /* Reap anything that exited before the handler was installed. */
    on_child(SIGCHLD);
    for (;;)
        pause();
}
