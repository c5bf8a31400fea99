package chart

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Chart is a grouped bar chart: one group of bars per category, one bar
// per series, optional min–max whiskers and a dashed reference line.
type Chart struct {
	Title      string
	YLabel     string
	Categories []string // labels; spaces may wrap onto a second line
	Series     []Series
	Ref        float64 // a horizontal reference line when > 0
	RefLabel   string
	Note       string // a line under the chart
}

// Series is one bar of every category. NaN values draw no bar.
type Series struct {
	Name   string
	Values []float64
	Lo, Hi []float64 // whiskers; nil for none
}

// Geometry of every chart, in SVG user units.
const (
	chartW     = 960.0
	chartH     = 500.0
	marginL    = 72.0
	marginR    = 20.0
	marginT    = 78.0
	marginB    = 76.0
	fontFamily = "DejaVu Sans, Helvetica, Arial, sans-serif"
)

// paletteColors colour the series in turn (colour-blind-safe, Okabe–Ito).
const paletteColors = "#0072B2 #E69F00 #009E73 #CC79A7 #56B4E9 #D55E00 #F0E442 #000000"

// color returns the colour of series i.
func color(i int) string {
	cs := strings.Fields(paletteColors)
	return cs[i%len(cs)]
}

// niceScale returns an axis maximum and tick step for data up to max:
// steps of 1, 2 or 5 times a power of ten, about five to eight ticks.
func niceScale(max float64) (top, step float64) {
	if !(max > 0) || math.IsInf(max, 0) {
		return 1, 0.2
	}
	raw := max / 6
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		step = m * pow
		if step >= raw {
			break
		}
	}
	// Headroom above the highest bar for its vertical value label.
	top = math.Ceil(max*1.12/step) * step
	return top, step
}

// tickLabel formats an axis value with the decimals its step needs.
func tickLabel(v, step float64) string {
	decimals := max(0, int(-math.Floor(math.Log10(step)+1e-9)))
	return strconv.FormatFloat(v, 'f', decimals, 64)
}

// valueLabel formats a bar's value with three significant digits.
func valueLabel(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
}

// esc escapes text for SVG.
func esc(s string) string {
	var b bytes.Buffer
	xml.EscapeText(&b, []byte(s))
	return b.String()
}

// SVG draws the chart as a standalone SVG document.
func (c Chart) SVG() []byte {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="%s">`+"\n",
		chartW, chartH, chartW, chartH, fontFamily)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	p(`<text x="%g" y="24" font-size="17" font-weight="bold">%s</text>`+"\n", marginL, esc(c.Title))

	top, step := niceScale(c.maxValue())
	plotW, plotH := chartW-marginL-marginR, chartH-marginT-marginB
	y := func(v float64) float64 { return marginT + plotH - v/top*plotH }

	// Legend, one row under the title.
	lx := marginL
	for i, s := range c.Series {
		p(`<rect x="%.1f" y="36" width="12" height="12" fill="%s"/>`+"\n", lx, color(i))
		p(`<text x="%.1f" y="46" font-size="12">%s</text>`+"\n", lx+16, esc(s.Name))
		lx += 16 + 7*float64(len(s.Name)) + 18
	}

	// Grid, ticks and axes.
	for i := 0; float64(i)*step <= top+step/2; i++ {
		v := float64(i) * step
		yy := y(v)
		p(`<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#dddddd"/>`+"\n", marginL, yy, chartW-marginR, yy)
		p(`<text x="%g" y="%.1f" font-size="11" text-anchor="end">%s</text>`+"\n", marginL-6, yy+4, tickLabel(v, step))
	}
	p(`<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#333333"/>`+"\n", marginL, marginT, marginL, marginT+plotH)
	p(`<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#333333"/>`+"\n", marginL, marginT+plotH, chartW-marginR, marginT+plotH)
	p(`<text x="16" y="%.1f" font-size="12" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>`+"\n",
		marginT+plotH/2, marginT+plotH/2, esc(c.YLabel))

	c.bars(p, y, plotW, plotH)
	if c.Ref > 0 {
		yy := y(c.Ref)
		p(`<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#aa0000" stroke-dasharray="6 4"/>`+"\n", marginL, yy, chartW-marginR, yy)
		p(`<text x="%g" y="%.1f" font-size="11" fill="#aa0000" text-anchor="end">%s</text>`+"\n", chartW-marginR-4, yy-4, esc(c.RefLabel))
	}
	if c.Note != "" {
		p(`<text x="%g" y="%g" font-size="11" fill="#555555">%s</text>`+"\n", marginL, chartH-10, esc(c.Note))
	}
	p("</svg>\n")
	return b.Bytes()
}

// maxValue is the highest value or whisker of the chart, or its reference
// line if that is higher.
func (c Chart) maxValue() float64 {
	maxV := c.Ref
	for _, s := range c.Series {
		for i, v := range s.Values {
			if !math.IsNaN(v) {
				maxV = math.Max(maxV, v)
			}
			if s.Hi != nil && i < len(s.Hi) && !math.IsNaN(s.Hi[i]) {
				maxV = math.Max(maxV, s.Hi[i])
			}
		}
	}
	return maxV
}

// bars draws each category's bars, with their whiskers and value labels,
// and the category's label under them.
func (c Chart) bars(p func(string, ...any), y func(float64) float64, plotW, plotH float64) {
	n := len(c.Categories)
	if n == 0 || len(c.Series) == 0 {
		return
	}
	groupW := plotW / float64(n)
	barW := groupW * 0.8 / float64(len(c.Series))
	for ci, cat := range c.Categories {
		gx := marginL + groupW*float64(ci) + groupW*0.1
		for si, s := range c.Series {
			if ci >= len(s.Values) || math.IsNaN(s.Values[ci]) {
				continue
			}
			v := s.Values[ci]
			x := gx + barW*float64(si)
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %s: %s</title></rect>`+"\n",
				x, y(v), math.Max(barW-1, 1), marginT+plotH-y(v), color(si), esc(cat), esc(s.Name), valueLabel(v))
			cx := x + barW/2
			labelY := y(v) - 4
			if s.Lo != nil && s.Hi != nil && ci < len(s.Lo) && ci < len(s.Hi) && !math.IsNaN(s.Lo[ci]) && !math.IsNaN(s.Hi[ci]) {
				lo, hi := y(s.Lo[ci]), y(s.Hi[ci])
				p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222222"/>`+"\n", cx, lo, cx, hi)
				p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222222"/>`+"\n", cx-3, lo, cx+3, lo)
				p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222222"/>`+"\n", cx-3, hi, cx+3, hi)
				labelY = math.Min(labelY, hi-4)
			}
			if barW >= 10 {
				// Vertical, so that neighbouring labels never overlap.
				p(`<text x="%.1f" y="%.1f" font-size="9" transform="rotate(-90 %.1f %.1f)">%s</text>`+"\n",
					cx+3, labelY, cx+3, labelY, valueLabel(v))
			}
		}
		// Category label, wrapped at spaces onto at most three lines.
		lines := wrap(cat, int(groupW/6.5))
		p(`<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle">`, gx+groupW*0.4, marginT+plotH+16)
		for li, l := range lines {
			dy := "0"
			if li > 0 {
				dy = "1.2em"
			}
			p(`<tspan x="%.1f" dy="%s">%s</tspan>`, gx+groupW*0.4, dy, esc(l))
		}
		p("</text>\n")
	}
}

// wrap splits s at spaces into lines of about width characters, at most
// three.
func wrap(s string, width int) []string {
	width = max(width, 6)
	var lines []string
	cur := ""
	for _, w := range strings.Fields(s) {
		switch {
		case cur == "":
			cur = w
		case len(cur)+1+len(w) <= width || len(lines) == 2:
			cur += " " + w
		default:
			lines = append(lines, cur)
			cur = w
		}
	}
	if cur != "" {
		lines = append(lines, cur)
	}
	return lines
}
