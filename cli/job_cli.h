/* job_cli.h - `lensd job run|merge` (cli/job_cli.c). */
#ifndef LENSD_JOB_CLI_H
#define LENSD_JOB_CLI_H

/* argv after "job"; returns the process exit code. */
int lensd_cmd_job(int argc, char **argv);

#endif
