// The oracle of tests/upstream_cases.rs: reads JSON lines {"t": kind, "in": input} and prints
// them back with the answers of k8s.io/apimachinery v0.37.2 (labels.Parse, fields.ParseSelector,
// the name and label validators, LabelSelectorAsSelector and ValidateLabelSelector).
// Test tooling only; see ../regen.sh.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

type in struct {
	T  string          `json:"t"`
	In json.RawMessage `json:"in"`
}

func errs(l field.ErrorList) []string {
	out := []string{}
	for _, e := range l {
		out = append(out, e.Error())
	}
	return out
}

func nz(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func main() {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for sc.Scan() {
		var c in
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			panic(err)
		}
		out := map[string]any{"t": c.T, "in": c.In}
		switch c.T {
		case "label":
			var s string
			json.Unmarshal(c.In, &s)
			sel, err := labels.Parse(s)
			if err != nil {
				out["err"] = err.Error()
			} else {
				out["ok"] = sel.String()
				out["empty"] = sel.Empty()
			}
		case "field":
			var s string
			json.Unmarshal(c.In, &s)
			sel, err := fields.ParseSelector(s)
			if err != nil {
				out["err"] = err.Error()
			} else {
				out["ok"] = sel.String()
				reqs := [][]string{}
				for _, r := range sel.Requirements() {
					reqs = append(reqs, []string{r.Field, string(r.Operator), r.Value})
				}
				out["reqs"] = reqs
			}
		case "v":
			var s string
			json.Unmarshal(c.In, &s)
			out["dns1123_label"] = nz(validation.IsDNS1123Label(s))
			out["dns1123_subdomain"] = nz(validation.IsDNS1123Subdomain(s))
			out["dns1035_label"] = nz(validation.IsDNS1035Label(s))
			out["qualified_name"] = nz(validation.IsQualifiedName(s))
			out["label_value"] = nz(validation.IsValidLabelValue(s))
			out["c_identifier"] = nz(validation.IsCIdentifier(s))
			out["config_map_key"] = nz(validation.IsConfigMapKey(s))
			out["env_var_name"] = nz(validation.IsEnvVarName(s))
			out["port_name"] = nz(validation.IsValidPortName(s))
			out["percent"] = nz(validation.IsValidPercent(s))
			out["http_header_name"] = nz(validation.IsHTTPHeaderName(s))
			out["wildcard_dns1123_subdomain"] = nz(validation.IsWildcardDNS1123Subdomain(s))
			out["name_subdomain_prefix"] = nz(apivalidation.NameIsDNSSubdomain(s, true))
			out["name_label_prefix"] = nz(apivalidation.NameIsDNSLabel(s, true))
			out["name_1035_prefix"] = nz(apivalidation.NameIsDNS1035Label(s, true))
			p := field.NewPath("metadata", "labels")
			out["labels"] = errs(metav1validation.ValidateLabels(map[string]string{s: s}, p))
			out["annotations"] = errs(apivalidation.ValidateAnnotations(map[string]string{s: "v"}, field.NewPath("metadata", "annotations")))
			out["quote"] = field.Invalid(field.NewPath("metadata", "name"), s, "d").Error()
			out["json_quote"] = field.Invalid(field.NewPath("x"), []string{s}, "").Error()
		case "json":
			var ls *metav1.LabelSelector
			if err := json.Unmarshal(c.In, &ls); err != nil {
				out["decode_err"] = err.Error()
				break
			}
			sel, err := metav1.LabelSelectorAsSelector(ls)
			if err != nil {
				out["err"] = err.Error()
			} else {
				out["ok"] = sel.String()
				out["empty"] = sel.Empty()
			}
			if ls != nil {
				out["validate"] = errs(metav1validation.ValidateLabelSelector(ls, metav1validation.LabelSelectorValidationOptions{}, field.NewPath("spec", "selector")))
			}
		default:
			panic(fmt.Sprint("unknown kind ", c.T))
		}
		if err := enc.Encode(out); err != nil {
			panic(err)
		}
	}
}
