/* train_cli.h - the `lensd train` subcommands (classify, vocab). */
#ifndef LENSD_TRAIN_CLI_H
#define LENSD_TRAIN_CLI_H

/* argv[0] is the subcommand; returns the process exit status. */
int lensd_cmd_train(int argc, char **argv);

#endif
