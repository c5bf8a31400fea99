// Package chart draws the grouped bar charts of BENCHMARKS.md as SVG,
// with no dependency: bars with min–max whiskers, a legend, a reference
// line and a note.
package chart
