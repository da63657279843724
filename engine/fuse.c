/* fuse.c - placeholder: no rewrites yet (see fuse.h). */
#include "fuse.h"
eng_status eng_graph_fuse(eng_graph *g) { (void)g; return ENG_STATUS_OK; }
