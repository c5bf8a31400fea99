package proc

// PageSize is the page size pagemap entries describe: x86-64 has one base
// page size.
const PageSize = 4096
