#!/bin/bash
# The images' HEALTHCHECK: GET /health on this container's port (FP8SERVE_PORT, as the server
# reads it) with bash alone, so the images need no HTTP client. Exit 0 only on 200.
set -u
exec 3<> "/dev/tcp/127.0.0.1/${FP8SERVE_PORT:-8000}" || exit 1
printf 'GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' >&3
IFS= read -r -t 5 status <&3 || exit 1
[[ $status == "HTTP/1."?" 200 "* ]]
