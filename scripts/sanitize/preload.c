/* Preloaded by scripts/sanitize.sh into every process of the sanitized test run. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Open MPI 4.1 and PMIx load their components with dlopen and unload them in
 * MPI_Finalize. LeakSanitizer runs after that and cannot name the module of an
 * allocation made inside an unloaded component, so cannot suppress it either, and
 * Open MPI 4.1 has no setting that keeps them. Never unloading keeps every module
 * mapped and named until exit; nothing in ncf_dist relies on unloading. */
int dlclose(void* handle) {
  (void)handle;
  return 0;
}

/* With gcc's shared runtimes, UndefinedBehaviorSanitizer beside AddressSanitizer
 * ignores log_path and reports on stderr only, which a test may capture and drop
 * (it expected the program to fail anyway). libubsan calls this hook on every
 * report: it leaves one line per report in $NCF_SANITIZER_REPORTS, where the script
 * looks after the run. Weak, so processes without libubsan load this file too. */
extern void __ubsan_get_current_report_data(const char** kind, const char** message,
                                            const char** file, unsigned* line,
                                            unsigned* column, char** address)
    __attribute__((weak));

void __ubsan_on_report(void) {
  const char* dir = getenv("NCF_SANITIZER_REPORTS");
  if (!dir || !__ubsan_get_current_report_data) return;
  const char *kind = "", *message = "", *file = "";
  unsigned line = 0, column = 0;
  char* address = NULL;
  __ubsan_get_current_report_data(&kind, &message, &file, &line, &column, &address);
  char exe[512];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  const char* slash = strrchr(exe, '/');
  char path[1024], text[2048];
  snprintf(path, sizeof path, "%s/report.%s.%d.ubsan", dir, slash ? slash + 1 : exe,
           (int)getpid());
  int len = snprintf(text, sizeof text, "%s:%u:%u: runtime error: %s [%s] in %s\n", file,
                     line, column, message, kind, exe);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  if (len > (int)sizeof text - 1) len = (int)sizeof text - 1;
  if (write(fd, text, (size_t)len) < 0) {
    /* Nothing better to do: the report is still on stderr. */
  }
  close(fd);
}
