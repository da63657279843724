#!/bin/sh
# entrypoint.sh - the image's entry point (run by tini as PID 1): TF Serving's container convention for tensord.
#
#   docker run -p 8501:8501 -v /path/to/m:/models/m -e MODEL_NAME=m tensord [FLAG...]
#       serves $MODEL_BASE_PATH/$MODEL_NAME (tensord reads those two variables itself, as TF Serving's server
#       does), gRPC on 0.0.0.0:8500 and REST on 0.0.0.0:8501 (all interfaces: the published ports reach the
#       container from outside it); each FLAG goes to `tensord serve` after ours, so a FLAG overrides ours
#       (a flag given twice: the last wins). `--model_config_file=...` replaces MODEL_BASE_PATH/MODEL_NAME.
#   docker run ... tensord serve [FLAG...]     the same
#   docker run ... tensord train|predict|...   that tensord subcommand instead: `tensord train ...`
#   docker run ... tensord sh                  any other command runs as given (a shell to look around)
#
# The admin API (port 8502) is off unless a token file is mounted at $TENSORD_ADMIN_TOKEN_FILE (default
# /run/secrets/tensord_admin_token, where `docker secret` and Kubernetes put secrets); then it listens on
# 0.0.0.0:8502 with that token. A token in the environment (TENSORD_ADMIN_TOKEN) is refused: every
# `docker inspect` shows it.
#
# Always `exec`s, so tensord is tini's child and receives SIGTERM from `docker stop` itself.
set -eu

TENSORD=/usr/local/bin/tensord

case "${1-}" in
serve) shift ;;
# tensord's subcommands other than serve (server/main.c)
init | train | evaluate | quantize | predict | admin | bench | conformance | version | --version | help | --help | -h)
    exec "$TENSORD" "$@" ;;
-* | "") ;;
*) exec "$@" ;;
esac

if [ -n "${TENSORD_ADMIN_TOKEN-}" ]; then
    echo "entrypoint: TENSORD_ADMIN_TOKEN is not used in the image (the environment shows in docker inspect);" \
         "mount the token as a file at ${TENSORD_ADMIN_TOKEN_FILE:-/run/secrets/tensord_admin_token}" >&2
    exit 2
fi
token_file=${TENSORD_ADMIN_TOKEN_FILE:-/run/secrets/tensord_admin_token}
if [ -f "$token_file" ]; then
    set -- --admin_port=8502 --admin_bind=0.0.0.0 --admin_token_file="$token_file" "$@"
elif [ -n "${TENSORD_ADMIN_TOKEN_FILE-}" ]; then
    echo "entrypoint: TENSORD_ADMIN_TOKEN_FILE=$token_file: no such file (mount the admin token there)" >&2
    exit 2
else
    set -- --admin_port=0 "$@"
fi

# A hint for the commonest mistake; tensord itself logs the same and keeps polling for the directory.
model_dir="${MODEL_BASE_PATH-}/${MODEL_NAME-}"
case " $* " in
*" --model_config_file"* | *" --model_base_path"*) ;;
*) [ -d "$model_dir" ] || echo "entrypoint: no model at $model_dir: mount one," \
       "e.g. docker run -v /path/to/m:${MODEL_BASE_PATH:-/models}/m -e MODEL_NAME=m ..." >&2 ;;
esac

# tensord serve would set this itself and re-execute through /proc/self/exe, which renames the process "exe" in
# ps and top; set here, the server keeps its name (an explicit setting still wins, as with tensord).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec "$TENSORD" serve --port=8500 --rest_api_port=8501 --grpc_api_host=0.0.0.0 --rest_api_host=0.0.0.0 "$@"
