/* ir/arena.c — bump allocator.  Everything a module owns lives in its arena and is
   freed in one call; nothing in the IR is freed on its own.  Freed blocks of the standard
   size are kept for the next arena (up to BLOCK_CACHE of them, shared by the threads):
   `loom plan` builds and frees thousands of modules, and fresh memory from the system is
   paid for in page faults every time. */
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

typedef struct Block {
  struct Block *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
} Block;

struct Arena {
  Block *head;
  size_t total;
};

Arena *arena_new(void) {
  Arena *a = calloc(1, sizeof *a);
  return a;
}

enum { BLOCK = 65536, BLOCK_CACHE = 1024 };
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static Block *cache;
static int n_cache;

static Block *block_new(size_t cap) {
  Block *b = NULL;
  if (cap == BLOCK) {
    pthread_mutex_lock(&cache_lock);
    if (cache) {
      b = cache;
      cache = b->next;
      n_cache--;
    }
    pthread_mutex_unlock(&cache_lock);
  }
  return b ? b : malloc(sizeof(Block) + cap);
}

static void block_free(Block *b) {
  if (b->cap == BLOCK) {
    pthread_mutex_lock(&cache_lock);
    bool kept = n_cache < BLOCK_CACHE;
    if (kept) {
      b->next = cache;
      cache = b;
      n_cache++;
    }
    pthread_mutex_unlock(&cache_lock);
    if (kept) return;
  }
  free(b);
}

void *arena_alloc(Arena *a, size_t n) {
  void *p = arena_alloc_uninit(a, n);
  memset(p, 0, (n + 15) & ~(size_t)15);
  return p;
}

void *arena_alloc_uninit(Arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (!a->head || a->head->cap - a->head->used < n) {
    size_t cap = n > BLOCK ? n : BLOCK;
    Block *b = block_new(cap);
    if (!b) {
      fprintf(stderr, "loom: out of memory (arena block of %zu bytes)\n", cap);
      abort();   /* the only non-recoverable failure: a compiler that cannot allocate */
    }
    b->next = a->head;
    b->used = 0;
    b->cap = cap;
    a->head = b;
    a->total += cap;
  }
  void *p = a->head->data + a->head->used;
  a->head->used += n;
  return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
  char *p = arena_alloc(a, n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_printf(Arena *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = arena_alloc(a, (size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(p, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return p;
}

void arena_free(Arena *a) {
  if (!a) return;
  for (Block *b = a->head, *next; b; b = next) {
    next = b->next;
    block_free(b);
  }
  free(a);
}

size_t arena_bytes(const Arena *a) { return a->total; }

void ptrvec_push(Arena *a, PtrVec *v, void *p) {
  if (v->n == v->cap) {
    int cap = v->cap ? v->cap * 2 : 8;
    void **items = arena_alloc(a, sizeof(void *) * (size_t)cap);
    if (v->n) memcpy(items, v->items, sizeof(void *) * (size_t)v->n);
    v->items = items;
    v->cap = cap;
  }
  v->items[v->n++] = p;
}
