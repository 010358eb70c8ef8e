#pragma once
// Runs a function in a forked child process and reports how it ended and what it wrote (stdout
// and stderr):
// the emulator's diagnostics abort the process, so they are tested from outside it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>

namespace fp8serve::test {

struct ChildResult {
  bool aborted = false;  // ended by SIGABRT
  int exit_code = -1;    // when it exited instead
  std::string stderr_text;  // stdout and stderr
};

inline ChildResult run_in_child(const std::function<void()>& body) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDOUT_FILENO);  // the test framework's output too, should it print any
    dup2(fds[1], STDERR_FILENO);
    close(fds[1]);
    signal(SIGABRT, SIG_DFL);  // an abort ends the child, unreported by the framework's handler
    body();
    _exit(0);  // no atexit handlers, no leak check: the child only reports how `body` ended
  }
  close(fds[1]);
  ChildResult result;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof buffer)) > 0;) result.stderr_text.append(buffer, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

}  // namespace fp8serve::test
