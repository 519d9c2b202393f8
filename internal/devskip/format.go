// SPDX-License-Identifier: Apache-2.0

package devskip

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// maxNames bounds the interfaces named on one line of Lines.
const maxNames = 8

// Lines says the report in a few lines for people: the total, each
// interface compared with what the kernel skipped there, and the
// interfaces not compared grouped by why.
func (r Report) Lines() []string {
	checked := 0
	var skipped []string
	notChecked := map[string][]string{}
	for _, in := range r.Ifaces {
		var parts []string
		for _, d := range []struct {
			name string
			d    Dir
		}{{"dev_xmit", in.Xmit}, {"dev_recv", in.Recv}, {"dev_queue", in.Queue}} {
			if d.d.NotChecked != "" {
				if in.NotChecked == "" && d.d.NotChecked != NotAttached {
					notChecked[d.name+": "+d.d.NotChecked] = append(notChecked[d.name+": "+d.d.NotChecked], in.Name)
				}
				continue
			}
			checked++
			if d.d.Skipped != 0 || d.d.Uncertain != 0 {
				p := fmt.Sprintf("%s %d of %d", d.name, d.d.Skipped, d.d.Handled)
				if d.d.Uncertain != 0 {
					p += fmt.Sprintf(" (±%d)", d.d.Uncertain)
				}
				parts = append(parts, p)
			}
		}
		if in.NotChecked != "" {
			notChecked[in.NotChecked] = append(notChecked[in.NotChecked], in.Name)
		}
		if len(parts) > 0 {
			skipped = append(skipped, fmt.Sprintf("%s (netns %d, ifindex %d): %s", in.Name, in.NetNS, in.Ifindex, strings.Join(parts, ", ")))
		}
	}
	head := fmt.Sprintf("%d device program runs the kernel did not make for frames the interfaces counted, over %d comparisons", r.Skipped, checked)
	if r.Uncertain > 0 {
		head += fmt.Sprintf(" (±%d: the programs ran while the counters were read)", r.Uncertain)
	}
	if checked == 0 {
		head = "no interface compared: nothing says whether the kernel ran the device programs for every frame"
	}
	out := []string{head}
	for _, s := range skipped {
		out = append(out, "  "+s)
	}
	for _, why := range slices.Sorted(maps.Keys(notChecked)) {
		names := notChecked[why]
		more := ""
		if len(names) > maxNames {
			more = fmt.Sprintf(" and %d more", len(names)-maxNames)
			names = names[:maxNames]
		}
		out = append(out, fmt.Sprintf("  not checked: %s%s (%s)", strings.Join(names, ", "), more, why))
	}
	for _, ns := range slices.Sorted(maps.Keys(r.NotRead)) {
		out = append(out, fmt.Sprintf("  not checked: netns %d (%s)", ns, r.NotRead[ns]))
	}
	return out
}
