// A library of the parent project declared without SHARED or STATIC: it
// must stay as the parent's BUILD_SHARED_LIBS says (unset: static).
int parent_answer() { return 42; }
