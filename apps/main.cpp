#include <cstdio>
int main() { std::puts("cider"); return 0; }
