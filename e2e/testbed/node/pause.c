/* The pod sandbox's process: holds the pod's namespaces open, reaps orphans, exits on
 * SIGINT or SIGTERM. Built static (gcc -static) into the test bed's pause image, as
 * Kubernetes' own build/pause does; nothing else runs in that image. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
	(void)sig;
	_exit(0);
}

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(int argc, char **argv) {
	if (argc > 1 && argv[1][0] == '-' && argv[1][1] == 'v') {
		puts("pause (headrace test bed)");
		return 0;
	}
	if (getpid() != 1)
		fputs("pause: warning: not pid 1\n", stderr);
	struct sigaction on_stop = {.sa_handler = stop};
	struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
	if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
	    sigaction(SIGCHLD, &on_child, NULL) < 0) {
		perror("pause: sigaction");
		return 1;
	}
	for (;;)
		pause();
}
