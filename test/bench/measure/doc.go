// Package measure holds the benchmark harness's instruments, which know
// nothing of its series: the programs it runs (Tools), the servers it
// starts and talks to (StartServer, Converse), snapctl's output
// (ParseDump, ParseRestore), the page cache (SetCache), the memory of
// processes (SmapsRollup, HugeState), MinIO, and the machine
// (DescribeMachine). Package main of test/bench measures with them.
package measure
