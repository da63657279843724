/* graph.h - the graph IR: values, nodes with ONNX attributes, initializers.
 *
 * A graph owns everything it points to (names, attribute payloads, initializer data); eng_graph_free releases
 * it all. Values are indexed by position; node inputs/outputs hold value indices, -1 for an omitted optional
 * input/output. Initializers are values with `init` set (its data owned by the graph). Graph inputs list only
 * the values a caller must feed (ONNX inputs that are not initializers, plus initializers listed as inputs,
 * which callers may override). Shapes of values are declared shapes: dims[i] = -1 when unknown or symbolic
 * (dim_param[i] then names the symbol, e.g. "N"). The IR is what autodiff will walk later: nodes are in ONNX
 * order (which ONNX requires to be topological), eng_graph_topo_order re-checks that.
 */
#ifndef ENG_GRAPH_H
#define ENG_GRAPH_H

#include <stdint.h>

#include "tensor.h"

typedef enum eng_attr_type {
    ENG_ATTR_UNDEFINED = 0,
    ENG_ATTR_FLOAT = 1,
    ENG_ATTR_INT = 2,
    ENG_ATTR_STRING = 3,
    ENG_ATTR_TENSOR = 4,
    ENG_ATTR_GRAPH = 5,
    ENG_ATTR_FLOATS = 6,
    ENG_ATTR_INTS = 7,
    ENG_ATTR_STRINGS = 8,
} eng_attr_type; /* ONNX AttributeProto.AttributeType numbers */

struct eng_graph;

typedef struct eng_attr {
    char *name;
    eng_attr_type type;
    float f;
    int64_t i;
    char *s;       /* NUL-terminated copy (s_len excludes the NUL; strings may hold bytes) */
    size_t s_len;
    float *floats; /* n entries */
    int64_t *ints; /* n entries */
    char **strings;/* n entries */
    int n;
    eng_tensor t;  /* ENG_ATTR_TENSOR: data owned by the attribute (malloc'd) */
    struct eng_graph *g; /* ENG_ATTR_GRAPH: owned subgraph */
} eng_attr;

typedef struct eng_node {
    char *name;    /* never NULL ("" if the model had none) */
    char *op_type;
    char *domain;  /* "" for the default ONNX domain */
    int *inputs;   /* value indices, -1 = omitted */
    int nin;
    int nimplicit; /* the last nimplicit of the nin inputs are outer-scope values the node's subgraphs read (If, Loop,
                    * Scan: their names, in eng_graph_outer_refs order per subgraph attribute, deduplicated); not ONNX
                    * inputs (onnx-save writes nin - nimplicit), but dependencies the planner orders and keeps alive */
    int *outputs;
    int nout;
    eng_attr *attrs;
    int nattr;
} eng_node;

typedef struct eng_value {
    char *name;
    eng_dtype dtype;      /* ENG_DTYPE_UNDEFINED when not declared */
    int ndim;             /* -1 when the rank is unknown */
    int64_t dims[ENG_MAX_DIMS]; /* -1 = unknown/symbolic */
    char *dim_param[ENG_MAX_DIMS]; /* symbol names, NULL if none */
    eng_tensor *init;     /* initializer value, or NULL; owned */
    int producer;         /* node index producing it, -1 for inputs/initializers */
} eng_value;

typedef struct eng_graph {
    char *name;
    eng_value *values;
    int nvalues, cap_values;
    eng_node *nodes;
    int nnodes, cap_nodes;
    int *inputs;   /* value indices fed by the caller */
    int ninputs;
    int *outputs;  /* value indices returned */
    int noutputs;
    /* model-level data (top-level graph only) */
    int64_t ir_version;
    int64_t opset;      /* default-domain opset version */
    int64_t opset_ml;   /* ai.onnx.ml opset, 0 if absent */
    char *producer_name;
    char *producer_version;
    char *doc_string;
    struct eng_graph *parent; /* enclosing graph for subgraphs (If/Loop bodies), NULL at the top */
} eng_graph;

eng_graph *eng_graph_new(void);
/* Frees everything the graph owns and sets *g to NULL. Safe on NULL. */
void eng_graph_free(eng_graph **g);

/* Value lookup by name; -1 if absent. O(nvalues). */
int eng_graph_find_value(const eng_graph *g, const char *name);
/* Add a value (name copied); returns its index or -1 on allocation failure. Name must be unique. */
int eng_graph_add_value(eng_graph *g, const char *name);
/* Add a node (strings copied, arrays copied); returns its index or -1. Sets producer of its outputs. */
int eng_graph_add_node(eng_graph *g, const char *name, const char *op_type, const char *domain, const int *inputs,
                       int nin, const int *outputs, int nout);
/* Deep-copy an attribute into node `node` (takes no ownership of `a`). */
eng_status eng_node_add_attr(eng_graph *g, int node, const eng_attr *a);
/* Move an attribute into node `node` (payload ownership passes to the graph, *a is zeroed; a subgraph's parent
 * is set to g). On failure *a is untouched and still owned by the caller. */
eng_status eng_node_take_attr(eng_graph *g, int node, eng_attr *a);
/* Free an attribute's payload (name, strings, arrays, tensor data, subgraph) and zero it; not the struct. */
void eng_attr_clear(eng_attr *a);
/* Free everything a node owns (names, io arrays, attributes) and zero it; the slot stays in g->nodes. */
void eng_node_release(eng_node *n);
/* Deep copy of a graph (subgraphs included); the copy's parent is g->parent. NULL on allocation failure. */
eng_graph *eng_graph_clone(const eng_graph *g);
/* Name -> value index table for bulk builders (loaders); the graph itself keeps no index. Zero-initialise,
 * add values as they are created, free with eng_name_index_free. Keys are borrowed from g's value names. */
typedef struct eng_name_index {
    int *slots; /* value index + 1, 0 = empty */
    size_t cap, n;
} eng_name_index;
int eng_name_index_find(const eng_name_index *ix, const eng_graph *g, const char *name); /* -1 if absent */
int eng_name_index_add(eng_name_index *ix, const eng_graph *g, int v);                   /* 0 on OOM */
void eng_name_index_free(eng_name_index *ix);
/* Take ownership of a tensor allocated with eng_alloc as the initializer of value v. */
void eng_value_set_init(eng_graph *g, int v, eng_tensor *t);

/* Attribute accessors; return the default when the attribute is absent. A present attribute of the wrong
 * type is a model error and is reported by eng_node_check_attr. */
const eng_attr *eng_node_attr(const eng_node *n, const char *name);
int64_t eng_node_attr_int(const eng_node *n, const char *name, int64_t dflt);
float eng_node_attr_float(const eng_node *n, const char *name, float dflt);
const char *eng_node_attr_str(const eng_node *n, const char *name, const char *dflt);
/* Returns entry count, or -1 if absent (then *out is NULL). */
int eng_node_attr_ints(const eng_node *n, const char *name, const int64_t **out);
int eng_node_attr_floats(const eng_node *n, const char *name, const float **out);

/* Values of subgraph `sub` that it reads (a node input or a graph output) but neither defines (node output,
 * initializer, graph input): the names it takes from enclosing graphs, in value order. *out malloc'd (free it; NULL
 * when *n is 0). */
eng_status eng_graph_outer_refs(const eng_graph *sub, int **out, int *n);

/* Nodes in an order where producers come before consumers; fails (naming a node) on a cycle or on an
 * input no node, initializer or graph input provides. `order` must hold g->nnodes ints. */
eng_status eng_graph_topo_order(const eng_graph *g, int *order);
/* Recompute every value's producer from the node list (after a rewrite moved or removed nodes). */
void eng_graph_index_producers(eng_graph *g);

/* Deep copy of an attribute tensor or initializer: eng_alloc'd data + malloc'd struct. */
eng_tensor *eng_tensor_clone(const eng_tensor *t);
void eng_tensor_destroy(eng_tensor **t); /* frees data (eng_free) and struct */

#endif
