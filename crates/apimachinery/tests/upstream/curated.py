#!/usr/bin/env python3
"""Oracle inputs from upstream's test tables (pkg/labels, pkg/fields, pkg/util/validation,
pkg/api/validate/content) plus hand-picked edge cases, one JSON line {"t": kind, "in": input}
each: the inputs, as facts, not the tests."""
import json, sys

label = [
    # TestSelectorParse good and bad
    "x=a,y=b,z=c", "", "x!=a,y=b", "x=", "x= ", "x=,z= ", "x= ,z= ", "!x", "x>1", "x>1,z<5",
    "x=a||y=b", "x==a==b", "!x=a", "x<a",
    "x=a,a=x", "a=x,x=a", "notin=in",
    # TestSetSelectorParser
    "\rx", "this-is-a-dns.domain.com/key-with-dash",
    "this-is-another-dns.domain.com/key-with-dash in (so,what)",
    "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)", "foo  in\t (abc)", "x notin\n (abc)",
    "x  notin\t\t\t(abc,def)", "x in (abc,def)", "x in (abc,)", "x in (abc,abc)", "x in ()",
    "x in (a,,)", "x in (a,,,)", "x in (a,,,,,,)", "x in (a,,a,,a,,a,,)",
    "x notin (abc,,def),bar,z in (),w", "x,y in (a)", "x=a", "x>1", "x<7", "x=a,y!=b",
    "x=a,y!=b,z in (h,i,j)", "x,,y", ",x,y", "x nott in (y)", "x notin ( )", "x notin (, a)",
    "a in (xyz),", "a in (xyz)b notin ()", "a ", "a in (x,y,notin, z,in)", "a in (xyz abc)",
    "a notin(", "a (", "(",
    # lexer/parser tables
    "key in ( value )", "key notin ( value )", "key in ( value1, value2 )", "key", "!key", "()",
    "x in (),y", "== != (), = notin", "key>2", "key<1", "!", "exists", "~", "||", "in", "notin",
    # operators and errors
    "x==y", "x!=", "x>", "x<", "x>-1", "x>99999999999999999999", "x>9223372036854775807",
    "x<007", "x>1.5", "x in (a", "x in a", "x in (a b)", "x in (a,(", "x in (,", "x in ((",
    "x notin", "x in", "x=a b", "x=(a)", "x=a)", "x=,", "x=a,", "x,", ",", "!,", "!!x", "!x,y",
    "x!", "x!!y", "x !=y", "x! =y", "x=!y", "x===y", "x=>y", "x<=y", "x<>y", "x>=1",
    "in in (in)", "notin notin (notin)", "in=notin", "x in (notin)", "x=in", "!in",
    # bad keys and values
    "bad key=x", "a/b/c=x", "-a=b", "a-=b", "A_b.C=x", "example.com/app=x", "Example.com/app=x",
    "/a", "a/", "a" * 63 + "=x", "a" * 64 + "=x", "a" * 253 + "/b=x", "a" * 254 + "/b=x",
    "x=" + "a" * 63, "x=" + "a" * 64, "x=-a", "x=a-", "x=a_b.c", "x in (a,-b,c-)",
    "x in (" + "b" * 64 + ",-c)", "é=x", "x=é", "x>a", "x>-a", "-x>-a",
    # whitespace and NUL
    " x = y ", "\tx\t=\ty\t", "\nx\n", "x\x00", "x=\x00y", "x=y,\x00z", "\x00", "x\x00y", "x=y \x00",
    "  ", " , ", "a = b , c != d",
]

field = [
    # TestSplitTerms, TestSplitTerm, TestEscapeValue, TestSelectorParse
    "a", "a=avalue", "a=avalue,b=bvalue", "a=avalue,b==bvalue,c!=cvalue", "", "a=a,", ",a=a",
    "k=\\,,k2=v2", "k=\\\\,k2=v2", "k=\\\\\\,,k2=v2", "k=\\a\\b\\", "k=\\", "함=수,목=록",
    "a=value", "b==value", "c!=value", "k=\\,", "k=\\=", "k=\\\\\\a\\b\\=\\,\\", "함=수",
    "x=a,y=b,z=c", "x!=a,y=b", "x=a||y\\=b", "x=a\\=\\=b", "x=a||y=b", "x==a==b", "x=a,b",
    "x in (a)", "x in (a,b,c)", "x", "x=a,a=x", "a=x,x=a", "notin=in",
    "foo=bar,baz=blah,complex=\\=value\\\\\\,\\\\",
    # edge cases
    "=", "==", "!=", "=x", "!=x", ",", ",,", "a=b,,c=d", "a = b", "a!b", "a!b=c", "a=!b", "a=b!",
    "a==", "a!==b", "a=\\!", "a=\\", "a=b\\", "a=\\😀", "a=😀", "metadata.name=foo",
    "metadata.namespace!=kube-system,status.phase=Running", "spec.nodeName=", "a=b=c", "a=b,c",
    "f\\,g=h", "f=g\\,h", "f=g\\\\", "z=1,a=2,m!=3",
]

v = [
    # TestIsDNS1123Label / Subdomain / DNS1035Label values
    "a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a", "1--a--b--2",
    "a" * 63, "", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_",
    "_a", "a_b", "1_", "_1", "1_2", ".", "a.", ".a", "a.b", "1.", ".1", "1.2", " ", "a ", " a",
    "a b", "1 ", " 1", "1 2", "a" * 64, "a.a", "ab.a", "a--1--2--b.a", "a.1", "0.a", "0.1",
    "a.b.c.d.e", "aa.bb.cc.dd.ee", "1.2.3.4.5", "11.22.33.44.55", "a" * 253, "a..b", "1..2",
    "A.a", "aB.a", "ab.A", "A.B.C.D.E", "a@b", "a,b", "a;b", "a:b", "a%b", "a?b", "a$b", "a" * 254,
    # TestIsQualifiedName
    "simple", "now-with-dashes", "1-starts-with-num", "1234", "simple/simple",
    "now-with-dashes/simple", "now-with-dashes/now-with-dashes", "now.with.dots/simple",
    "now-with.dashes-and.dots/simple", "1-num.2-num/3-num", "1234/5678", "1.2.3.4/5678",
    "Uppercase_Is_OK_123", "example.com/Uppercase_Is_OK_123", "requests.storage-foo",
    "a" * 253 + "/" + "b" * 63, "nospecialchars%^=@", "cantendwithadash-",
    "-cantstartwithadash-", "only/one/slash", "Example.com/abc", "example_com/abc",
    "example.com/", "/simple", "a" * 254 + "/abc",
    # TestIsValidLabelValue
    "end-with-num-1", "Tama-nui-te-rā.is.Māori.sun", "\\backslashes\\are\\bad",
    "-starts-with-dash", "ends-with-dash-", ".starts.with.dot", "ends.with.dot.",
    # port names, percents, header names, C identifiers, env vars, config map keys
    "telnet", "re-mail-ck", "pop3", "a-1-b-2-c", "1-a-2-b-3", "longerthan15characters",
    "a" * 16, "12345", "1-2-3-4", "-begin", "end-", "two--hyphens", "whois++", "0%", "01%",
    "100%", "%", "1", "1.5%", "Accept-Encoding", "X-Forwarded-For:", "my_name", "MY_NAME",
    "_x", "1x", "my.env-name", "..", "...", "..a", "a..", "key.name",
    "*.example.com", "*.", "*", "**.a", "*.A",
    # generateName prefixes
    "foo-", "a-", "-", "ab-", "é-", "a" * 253 + "-", "a" * 254 + "-", "a" * 63 + "-", "a" * 64 + "-",
    "foo.bar-", "Foo-", "1abc-",
    # quoting and lowercasing
    "Foo", "İ", "K", "Σ", "\n", "\x00", "\x7f", "\u00a0", "\u200b", "\u0378", "😀", "\U000e0001",
    "<&>", '"', "\u2028", "\ufeff", "\x1b[0m", "Example.COM/Key", "EXAMPLE.com/İ",
]

jsn = [
    None, {}, {"matchLabels": {}}, {"matchLabels": None}, {"matchExpressions": []},
    {"matchLabels": {"app": "web"}}, {"matchLabels": {"app": "web", "tier": "db"}},
    {"matchLabels": {"app": None}}, {"matchLabels": {"bad key": "x"}},
    {"matchLabels": {"app": "-bad"}},
    {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]}]},
    {"matchExpressions": [{"key": "a", "operator": "In", "values": ["y", "x", "y"]}]},
    {"matchExpressions": [{"key": "a", "operator": "In"}]},
    {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
    {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]},
    {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
    {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
    {"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]},
    {"matchExpressions": [{"key": "a", "operator": "Foo"}]},
    {"matchExpressions": [{"key": "a", "operator": "<in>"}]},
    {"matchExpressions": [{"key": "a", "operator": ""}]},
    {"matchExpressions": [{"key": "a"}]},
    {"matchExpressions": [{"operator": "Exists"}]},
    {"matchExpressions": [{"key": "", "operator": "In"}]},
    {"matchExpressions": [{"key": "a/b/c", "operator": "In", "values": ["-x", "y"]}]},
    {"matchExpressions": [None]},
    {"matchLabels": {"z": "1"}, "matchExpressions": [{"key": "a", "operator": "Exists"},
                                                    {"key": "m", "operator": "NotIn", "values": ["p", "q"]}]},
]

out = sys.stdout
for s in label:
    out.write(json.dumps({"t": "label", "in": s}, ensure_ascii=False) + "\n")
for s in field:
    out.write(json.dumps({"t": "field", "in": s}, ensure_ascii=False) + "\n")
for s in v:
    out.write(json.dumps({"t": "v", "in": s}, ensure_ascii=False) + "\n")
for s in jsn:
    out.write(json.dumps({"t": "json", "in": s}, ensure_ascii=False) + "\n")
