package report

import ()

// A section is the report's side of a series of the harness: it checks and
// writes the results the series of the same name stored in a SizeResult.
type section struct {
	Name string // the series'
	// Validate checks sr's results of the series, if it has any.
	Validate func(runs int, sr *SizeResult, bad func(string, ...any))
	// Render writes the series' section of one size, if it has results.
	Render func(m *md, sr *SizeResult)
}

// extraSections are the sections of the series in harness.ExtraSeries, in the
// same order.
var extraSections = []section{
	{Name: "codec", Validate: validateCodecs, Render: renderCodecs},
	{Name: "crypt", Validate: validateCrypt, Render: renderCrypt},
	{Name: "huge", Validate: validateHuge, Render: renderHuge},
	{Name: "incremental", Validate: validateIncremental, Render: renderIncremental},
	{Name: "precopy", Validate: validatePreCopy, Render: renderPreCopy},
	{Name: "replicas", Validate: validateReplicas, Render: renderReplicas},
	{Name: "s3", Validate: validateS3, Render: renderS3},
	{Name: "torch", Validate: validateTorch, Render: renderTorch},
	{Name: "tree", Validate: validateTree, Render: renderTree},
	{Name: "workingset", Validate: validateWorkingSet, Render: workingSetSection},
}

// SectionNames returns the names of extraSections, in order, for a test
// to hold them to the harness's series.
func SectionNames() []string {
	var names []string
	for _, s := range extraSections {
		names = append(names, s.Name)
	}
	return names
}
