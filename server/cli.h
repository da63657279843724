/* cli.h - tensord's subcommands. Each returns the process exit code: 0 success, 1 failure, 2 usage error. */
#ifndef SRV_CLI_H
#define SRV_CLI_H

int srv_cmd_predict(int argc, char **argv);
int srv_cmd_bench(int argc, char **argv);
int srv_cmd_conformance(int argc, char **argv);
int srv_cmd_admin(int argc, char **argv); /* cli-admin.c: the admin API from the command line */

/* Parse "--name=value" or "--name value" at argv[*i]; returns the value (advancing *i) or NULL if argv[*i] is
 * not that flag. Exits with usage error text when the value is missing. */
const char *srv_flag(int argc, char **argv, int *i, const char *name);
/* A flag's value as an integer >= lo: 0, or -1 after printing `error: FLAG: 'V' is not an integer >= LO`. */
int srv_flag_i64(const char *flag, const char *v, long long lo, long long *out);

#endif
