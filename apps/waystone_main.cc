#include "cli/commands.h"

int main(int argc, char** argv) { return waystone::cli::Main(argc, argv); }
