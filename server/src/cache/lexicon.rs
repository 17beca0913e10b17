//! The word lists the semantic cache's verifier reads: question and
//! function words, filler that does not change a question, negations,
//! opposites, units (with their spellings), number words, positions
//! ("first", "next", "last"), and the function words that tell one
//! language from another. Plain data; `verify.rs` owns what is done with it.

/// Words that start or shape a question rather than say what it is about.
#[rustfmt::skip]
pub const STOPWORDS: &[&str] = &[
    "a", "about", "am", "an", "and", "any", "anyone", "are", "as", "at", "be", "been", "being",
    "but", "by", "can", "could", "did", "do", "does", "doing", "for", "from", "get", "got", "had",
    "has", "have", "he", "her", "here", "him", "his", "how", "i", "i'd", "i'm", "i've", "if", "in",
    "into", "is", "it", "it's", "its", "just", "let", "me", "might", "must", "my", "of", "on", "or",
    "our", "out", "she", "should", "so", "some", "someone", "than", "that", "the", "their", "them",
    "then", "there", "these", "they", "this", "those", "to", "up", "us", "was", "we", "were",
    "what", "what's", "whats", "when", "where", "which", "who", "who's", "whom", "whose", "why",
    "will", "with", "would", "you", "your", "u", "ur", "y'all", "there's", "that's", "how's",
    "where's", "when's", "why's", "does", "gonna", "wanna",
];

/// Words that make a request polite, hedge it or frame it, without
/// changing what answers it ("What's the best way to ...", "Quick
/// question: ...", "Tell me ...", "I need to know ...").
#[rustfmt::skip]
pub const FILLER: &[&str] = &[
    "actually", "again", "also", "anybody", "approximately", "ask", "asking", "basically", "best",
    "briefly", "calculate", "called", "compute", "correct", "curious", "define", "definition",
    "describe", "detail", "details", "determine", "easiest", "easy", "exact", "exactly", "explain",
    "figure", "find", "give", "go", "going", "good", "guide", "hello", "help", "hey", "hi", "idea",
    "info", "information", "kind", "kindly", "know", "learn", "like", "look", "looking", "mean",
    "meaning", "method", "name", "need", "needed", "please", "pls", "plz", "precisely", "procedure",
    "process", "proper", "properly", "provide", "question", "quick", "quickly", "real", "really",
    "right", "roughly", "say", "see", "show", "simple", "simplest", "simply", "somebody",
    "something", "sure", "tell", "thank", "thanks", "thing", "things", "think", "try", "trying",
    "understand", "want", "way", "ways", "wonder", "wondering", "work", "would", "write", "yeah",
    "convert", "conversion", "translate", "translation", "equal", "equals", "equivalent", "amount",
    "number", "city", "many", "much", "long", "old", "time", "year", "degree", "degrees",
    "quantity", "total", "ok", "okay", "now", "currently", "today", "go", "well", "step-by-step",
    "step", "instructions", "instruction", "steps", "tip", "tips", "advice", "recommend", "suggest",
    "there", "possible", "manage", "able", "should", "ought", "correctly", "typically", "usually",
    "generally", "normally", "common", "commonly", "average", "make", "made", "making", "makes",
    "get", "getting", "use", "used", "using", "happen", "happened", "located", "location", "recipe",
    "homemade", "main", "command", "syntax", "trick", "rid", "goes", "explained", "reason",
    "reasons", "cause", "causes", "caused", "officially", "official", "exist", "exists", "called",
    "named", "considered", "whole", "entire", "overall", "ingredient", "ingredients", "prepare",
    "secret", "secrets", "occur", "occurred", "state", "lot",
];

/// Words that negate a question ("not", "never", "don't", "avoid").
#[rustfmt::skip]
pub const NEGATIONS: &[&str] = &[
    "not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor", "without",
    "cannot", "can't", "don't", "doesn't", "didn't", "isn't", "aren't", "wasn't", "weren't",
    "won't", "wouldn't", "shouldn't", "couldn't", "mustn't", "haven't", "hasn't", "hadn't", "dont",
    "doesnt", "didnt", "isnt", "arent", "wont", "shouldnt", "cant", "couldnt", "avoid", "unable",
    "except", "excluding", "lack", "lacks", "lacking", "fail", "fails", "failed",
];

/// Words that ask the same thing as another, with the one they stand for
/// (compared after this rewrite, by stem).
#[rustfmt::skip]
pub const SYNONYMS: &[(&str, &str)] = &[
    ("tallest", "highest"), ("biggest", "largest"), ("tiniest", "smallest"),
    ("quickest", "fastest"), ("earth", "world"), ("globe", "world"), ("nation", "country"),
    ("nations", "country"), ("spot", "point"), ("part", "point"), ("sea", "ocean"),
    ("replacement", "substitute"), ("alternative", "substitute"), ("alternatives", "substitute"),
    ("replace", "substitute"), ("neighbor", "border"), ("neighbors", "border"),
    ("neighboring", "border"), ("neighbour", "border"), ("neighbours", "border"),
    ("neighbouring", "border"), ("bordering", "border"), ("library", "package"),
    ("libraries", "package"), ("module", "package"), ("modules", "package"), ("txt", "text"),
    ("iterate", "loop"), ("repeated", "duplicate"), ("repeat", "duplicate"), ("item", "element"),
    ("items", "element"), ("entries", "element"), ("handle", "catch"), ("handling", "catch"),
    ("collapse", "fall"), ("collapsed", "fall"), ("author", "write"), ("writer", "write"),
    ("wrote", "write"), ("written", "write"), ("painter", "paint"), ("inventor", "invent"),
    ("discoverer", "discover"), ("founder", "found"), ("creator", "create"), ("speed", "fast"),
    ("velocity", "fast"), ("quickly", "fast"), ("inhabitants", "population"),
    ("residents", "population"), ("vehicle", "car"), ("automobile", "car"), ("purchase", "buy"),
    ("begin", "start"), ("finish", "end"), ("physician", "doctor"), ("kids", "child"),
    ("kid", "child"), ("children", "child"), ("fix", "repair"), ("delete", "remove"),
    ("erase", "remove"), ("cost", "price"), ("costs", "price"), ("pricing", "price"),
    ("film", "movie"), ("films", "movie"), ("tyre", "tire"), ("tyres", "tire"), ("colour", "color"),
    ("favourite", "favorite"), ("centre", "center"), ("metre", "meter"), ("litre", "liter"),
    ("travelling", "traveling"),
];

/// Phrases written more than one way, rewritten (lowercased, whole words)
/// to one spelling before a prompt is read: "World War II" and "WW2",
/// "the United States" and "the USA", "miles per hour" and "mph".
#[rustfmt::skip]
pub const ALIASES: &[(&str, &str)] = &[
    ("second world war", "WW2"), ("world war ii", "WW2"), ("world war 2", "WW2"),
    ("world war two", "WW2"), ("wwii", "WW2"), ("ww2", "WW2"), ("first world war", "WW1"),
    ("world war i", "WW1"), ("world war 1", "WW1"), ("world war one", "WW1"), ("wwi", "WW1"),
    ("ww1", "WW1"), ("united states of america", "USA"), ("united states", "USA"),
    ("u.s.a.", "USA"), ("u.s.", "USA"), ("america", "USA"), ("american", "USA"),
    ("united kingdom", "UK"), ("great britain", "UK"), ("britain", "UK"), ("british", "UK"),
    ("new york city", "NYC"), ("new york", "NYC"), ("wi-fi", "wifi"), ("e-mail", "email"),
    ("miles per hour", "mph"), ("miles an hour", "mph"), ("kilometers per hour", "kmh"),
    ("kilometres per hour", "kmh"), ("km per hour", "kmh"), ("km an hour", "kmh"),
    ("meters per second", "m/s"), ("metres per second", "m/s"), ("prior to", "before"),
    ("most recent", "last"), ("time zone", "timezone"), ("time-zone", "timezone"),
    ("line-by-line", "line by line"), ("us dollars", "dollars"), ("us dollar", "dollar"),
    ("u.s. dollars", "dollars"), ("macos", "Mac"), ("mac os", "Mac"), ("os x", "Mac"),
    ("osx", "Mac"), ("google chrome", "Chrome"), ("windows pc", "Windows"),
    ("on earth", "in the world"), ("on the planet", "in the world"), ("set up", "create"),
    ("setup", "create"), ("go through", "loop"), ("loop through", "loop"), ("loop over", "loop"),
    ("come down", "fall"), ("came down", "fall"), ("take place", "happen"),
    ("took place", "happen"), ("get rid of", "remove"),
];

/// Pairs of words that ask opposite questions; compared by stem (see
/// `verify::stem`), so "advantages" meets "advantage".
#[rustfmt::skip]
pub const OPPOSITES: &[(&str, &str)] = &[
    ("advantage", "disadvantage"), ("pro", "con"), ("benefit", "drawback"), ("benefit", "risk"),
    ("benefit", "downside"), ("upside", "downside"), ("increase", "decrease"),
    ("increase", "reduce"), ("raise", "lower"), ("rise", "fall"), ("grow", "shrink"),
    ("gain", "lose"), ("gain", "loss"), ("profit", "loss"), ("win", "lose"),
    ("largest", "smallest"), ("biggest", "smallest"), ("bigger", "smaller"), ("larger", "smaller"),
    ("big", "small"), ("large", "small"), ("most", "least"), ("more", "less"), ("more", "fewer"),
    ("best", "worst"), ("better", "worse"), ("highest", "lowest"), ("higher", "lower"),
    ("high", "low"), ("tallest", "shortest"), ("longest", "shortest"), ("longer", "shorter"),
    ("long", "short"), ("fastest", "slowest"), ("faster", "slower"), ("fast", "slow"),
    ("speed", "slow"), ("hottest", "coldest"), ("hot", "cold"), ("warm", "cool"), ("heat", "cool"),
    ("warmer", "cooler"), ("oldest", "youngest"), ("oldest", "newest"), ("old", "new"),
    ("old", "young"), ("older", "younger"), ("earliest", "latest"), ("early", "late"),
    ("first", "last"), ("before", "after"), ("above", "below"), ("over", "under"), ("up", "down"),
    ("upper", "lower"), ("uppercase", "lowercase"), ("ascending", "descending"), ("top", "bottom"),
    ("left", "right"), ("north", "south"), ("east", "west"), ("inside", "outside"),
    ("internal", "external"), ("buy", "sell"), ("import", "export"), ("add", "remove"),
    ("add", "subtract"), ("add", "delete"), ("insert", "delete"), ("plus", "minus"),
    ("multiply", "divide"), ("enable", "disable"), ("open", "close"), ("start", "stop"),
    ("start", "end"), ("begin", "end"), ("begin", "finish"), ("lock", "unlock"),
    ("install", "uninstall"), ("mount", "unmount"), ("encrypt", "decrypt"), ("encode", "decode"),
    ("compress", "decompress"), ("serialize", "deserialize"), ("upload", "download"),
    ("push", "pull"), ("merge", "split"), ("join", "split"), ("connect", "disconnect"),
    ("freeze", "thaw"), ("freeze", "melt"), ("inhale", "exhale"), ("true", "false"),
    ("positive", "negative"), ("strong", "weak"), ("rich", "poor"), ("heavy", "light"),
    ("light", "dark"), ("wet", "dry"), ("full", "empty"), ("odd", "even"), ("cheap", "expensive"),
    ("cheapest", "expensive"), ("easy", "hard"), ("easy", "difficult"), ("safe", "dangerous"),
    ("healthy", "unhealthy"), ("love", "hate"), ("like", "dislike"), ("agree", "disagree"),
    ("legal", "illegal"), ("same", "different"), ("similar", "different"),
    ("similarity", "difference"), ("synonym", "antonym"), ("cause", "effect"), ("cause", "cure"),
    ("symptom", "cure"), ("birth", "death"), ("born", "died"), ("born", "die"),
    ("arrive", "depart"), ("arrival", "departure"), ("sunrise", "sunset"), ("summer", "winter"),
    ("day", "night"), ("input", "output"), ("send", "receive"), ("give", "take"),
    ("lend", "borrow"), ("debit", "credit"), ("inflation", "deflation"), ("acid", "base"),
    ("acidic", "basic"), ("maximum", "minimum"), ("max", "min"), ("min", "max"), ("male", "female"),
    ("men", "women"), ("man", "woman"), ("boy", "girl"), ("attack", "defend"),
    ("offense", "defense"), ("expand", "collapse"), ("zoom", "shrink"), ("show", "hide"),
    ("include", "exclude"), ("allow", "block"), ("allow", "deny"), ("accept", "reject"),
    ("pass", "fail"), ("success", "failure"), ("increase", "lower"), ("strengthen", "weaken"),
    ("tighten", "loosen"), ("wake", "sleep"), ("asleep", "awake"),
    ("clockwise", "counterclockwise"), ("clockwise", "anticlockwise"), ("forward", "backward"),
    ("forwards", "backwards"), ("sweet", "sour"), ("sweet", "bitter"), ("thick", "thin"),
    ("wide", "narrow"), ("deep", "shallow"), ("near", "far"), ("closest", "farthest"),
    ("nearest", "farthest"), ("vertical", "horizontal"), ("horizontally", "vertically"),
    ("row", "column"), ("sum", "product"), ("endothermic", "exothermic"), ("singular", "plural"),
    ("morning", "night"), ("morning", "evening"), ("morning", "afternoon"),
    ("afternoon", "evening"), ("sum", "difference"), ("union", "intersection"), ("lend", "repay"),
    ("upgrade", "downgrade"), ("overestimate", "underestimate"), ("inbound", "outbound"),
    ("incoming", "outgoing"), ("client", "server"), ("rent", "own"), ("bull", "bear"),
    ("bullish", "bearish"), ("save", "spend"), ("deposit", "withdraw"), ("hire", "fire"),
    ("gain", "lose"), ("fill", "drain"), ("charge", "discharge"), ("on", "off"),
];

/// Prefixes that turn a word into its opposite ("install" / "uninstall").
pub const OPPOSITE_PREFIXES: &[&str] = &["un", "dis", "in", "im", "il", "ir", "non", "anti", "de"];

/// Units of time: units only after a number ("3 hours"), topic words
/// otherwise ("water a day").
pub const TIME_UNITS: &[&str] = &["s", "min", "h", "d", "wk", "mo", "yr"];

/// Units, currencies and languages, each spelling with its canonical
/// name: they are key terms, and their order around "to" / "into" /
/// "from" is the direction of a conversion or translation.
#[rustfmt::skip]
pub const UNITS: &[(&str, &str)] = &[
    ("km", "km"), ("kms", "km"), ("kilometer", "km"), ("kilometers", "km"), ("kilometre", "km"),
    ("kilometres", "km"), ("mile", "mi"), ("miles", "mi"), ("mi", "mi"), ("meter", "m"),
    ("meters", "m"), ("metre", "m"), ("metres", "m"), ("m", "m"), ("cm", "cm"),
    ("centimeter", "cm"), ("centimeters", "cm"), ("centimetre", "cm"), ("centimetres", "cm"),
    ("mm", "mm"), ("millimeter", "mm"), ("millimeters", "mm"), ("millimetre", "mm"),
    ("millimetres", "mm"), ("inch", "in"), ("inches", "in"), ("foot", "ft"), ("feet", "ft"),
    ("ft", "ft"), ("yard", "yd"), ("yards", "yd"), ("yd", "yd"), ("kg", "kg"), ("kgs", "kg"),
    ("kilo", "kg"), ("kilos", "kg"), ("kilogram", "kg"), ("kilograms", "kg"), ("kilogramme", "kg"),
    ("g", "g"), ("gram", "g"), ("grams", "g"), ("gramme", "g"), ("grammes", "g"), ("mg", "mg"),
    ("milligram", "mg"), ("milligrams", "mg"), ("lb", "lb"), ("lbs", "lb"), ("pound", "lb"),
    ("pounds", "lb"), ("oz", "oz"), ("ounce", "oz"), ("ounces", "oz"), ("ton", "t"), ("tons", "t"),
    ("tonne", "t"), ("tonnes", "t"), ("l", "l"), ("liter", "l"), ("liters", "l"), ("litre", "l"),
    ("litres", "l"), ("ml", "ml"), ("milliliter", "ml"), ("milliliters", "ml"),
    ("millilitre", "ml"), ("millilitres", "ml"), ("gallon", "gal"), ("gallons", "gal"),
    ("gal", "gal"), ("quart", "qt"), ("quarts", "qt"), ("pint", "pt"), ("pints", "pt"),
    ("cup", "cup"), ("cups", "cup"), ("tablespoon", "tbsp"), ("tablespoons", "tbsp"),
    ("tbsp", "tbsp"), ("teaspoon", "tsp"), ("teaspoons", "tsp"), ("tsp", "tsp"), ("celsius", "c"),
    ("centigrade", "c"), ("°c", "c"), ("fahrenheit", "f"), ("°f", "f"), ("kelvin", "k"),
    ("mph", "mph"), ("kph", "kmh"), ("km/h", "kmh"), ("kmh", "kmh"), ("knot", "kn"),
    ("knots", "kn"), ("m/s", "mps"), ("seconds", "s"), ("sec", "s"), ("secs", "s"),
    ("minute", "min"), ("minutes", "min"), ("mins", "min"), ("hour", "h"), ("hours", "h"),
    ("hr", "h"), ("hrs", "h"), ("day", "d"), ("days", "d"), ("week", "wk"), ("weeks", "wk"),
    ("month", "mo"), ("months", "mo"), ("years", "yr"), ("byte", "b"), ("bytes", "b"),
    ("bit", "bit"), ("bits", "bit"), ("kb", "kb"), ("kilobyte", "kb"), ("kilobytes", "kb"),
    ("mb", "mb"), ("megabyte", "mb"), ("megabytes", "mb"), ("gb", "gb"), ("gigabyte", "gb"),
    ("gigabytes", "gb"), ("tb", "tb"), ("terabyte", "tb"), ("terabytes", "tb"), ("kib", "kib"),
    ("mib", "mib"), ("gib", "gib"), ("mbps", "mbps"), ("gbps", "gbps"), ("acre", "acre"),
    ("acres", "acre"), ("hectare", "ha"), ("hectares", "ha"), ("ha", "ha"), ("psi", "psi"),
    ("pascal", "pa"), ("pa", "pa"), ("kpa", "kpa"), ("atm", "atm"), ("atmosphere", "atm"),
    ("atmospheres", "atm"), ("joule", "j"), ("joules", "j"), ("calorie", "cal"),
    ("calories", "cal"), ("kcal", "kcal"), ("watt", "w"), ("watts", "w"), ("kw", "kw"),
    ("kilowatt", "kw"), ("kilowatts", "kw"), ("horsepower", "hp"), ("hp", "hp"), ("radian", "rad"),
    ("radians", "rad"), ("percent", "%"), ("%", "%"), ("usd", "usd"), ("dollar", "usd"),
    ("dollars", "usd"), ("$", "usd"), ("eur", "eur"), ("euro", "eur"), ("euros", "eur"),
    ("€", "eur"), ("gbp", "gbp"), ("sterling", "gbp"), ("£", "gbp"), ("yen", "jpy"), ("jpy", "jpy"),
    ("¥", "jpy"), ("yuan", "cny"), ("rmb", "cny"), ("cny", "cny"), ("rupee", "inr"),
    ("rupees", "inr"), ("inr", "inr"), ("peso", "mxn"), ("pesos", "mxn"), ("franc", "chf"),
    ("francs", "chf"), ("chf", "chf"), ("cad", "cad"), ("aud", "aud"), ("krona", "sek"),
    ("kronor", "sek"), ("bitcoin", "btc"), ("btc", "btc"), ("english", "english"),
    ("french", "french"), ("spanish", "spanish"), ("german", "german"), ("italian", "italian"),
    ("portuguese", "portuguese"), ("dutch", "dutch"), ("russian", "russian"),
    ("chinese", "chinese"), ("mandarin", "chinese"), ("japanese", "japanese"), ("korean", "korean"),
    ("arabic", "arabic"), ("hindi", "hindi"), ("greek", "greek"), ("latin", "latin"),
    ("swedish", "swedish"), ("polish", "polish"), ("turkish", "turkish"), ("hebrew", "hebrew"),
    ("binary", "binary"), ("decimal", "decimal"), ("hex", "hex"), ("hexadecimal", "hex"),
    ("octal", "octal"), ("roman", "roman"), ("utc", "utc"), ("gmt", "utc"), ("est", "est"),
    ("edt", "est"), ("pst", "pst"), ("pdt", "pst"), ("cst", "cst"), ("cet", "cet"), ("ist", "ist"),
    ("jst", "jst"), ("json", "json"), ("yaml", "yaml"), ("xml", "xml"), ("csv", "csv"),
    ("jpg", "jpg"), ("jpeg", "jpg"), ("png", "png"), ("pdf", "pdf"), ("mp3", "mp3"), ("mp4", "mp4"),
    ("fraction", "fraction"), ("fractions", "fraction"),
];

/// Number words; "twenty five" adds, "two hundred" multiplies.
#[rustfmt::skip]
pub const NUMBER_WORDS: &[(&str, u64)] = &[
    ("zero", 0), ("one", 1), ("two", 2), ("three", 3), ("four", 4), ("five", 5), ("six", 6),
    ("seven", 7), ("eight", 8), ("nine", 9), ("ten", 10), ("eleven", 11), ("twelve", 12),
    ("thirteen", 13), ("fourteen", 14), ("fifteen", 15), ("sixteen", 16), ("seventeen", 17),
    ("eighteen", 18), ("nineteen", 19), ("twenty", 20), ("thirty", 30), ("forty", 40),
    ("fifty", 50), ("sixty", 60), ("seventy", 70), ("eighty", 80), ("ninety", 90), ("dozen", 12),
    ("hundred", 100), ("thousand", 1_000), ("million", 1_000_000), ("billion", 1_000_000_000),
];

/// Ordinals, as the number they stand for ("third" = 3).
#[rustfmt::skip]
pub const ORDINALS: &[(&str, u64)] = &[
    ("first", 1), ("second", 2), ("third", 3), ("fourth", 4), ("fifth", 5), ("sixth", 6),
    ("seventh", 7), ("eighth", 8), ("ninth", 9), ("tenth", 10), ("eleventh", 11), ("twelfth", 12),
    ("twentieth", 20), ("hundredth", 100),
];

/// Positions in a sequence that are not numbers ("the next step", "the
/// last one"), with their canonical word.
#[rustfmt::skip]
pub const POSITIONS: &[(&str, &str)] = &[
    ("next", "next"), ("last", "last"), ("final", "last"), ("finally", "last"),
    ("previous", "previous"), ("preceding", "previous"), ("following", "next"),
    ("afterwards", "next"), ("initial", "1"), ("initially", "1"), ("beginning", "1"),
    ("penultimate", "penultimate"), ("middle", "middle"), ("latest", "last"),
];

/// Words that show a question is in another language than English.
pub const LANGUAGES: &[(&str, &[&str])] = &[
    (
        "en",
        &[
            "the", "is", "what", "how", "of", "and", "to", "in", "do", "does", "i", "you", "for",
            "with", "are", "which", "who", "why", "can", "my", "it", "on", "what's", "should",
            "where", "when", "this", "that", "from", "into", "much", "many", "me", "please", "was",
            "were", "did", "has", "have", "an", "there", "your",
        ],
    ),
    (
        "es",
        &[
            "el",
            "los",
            "las",
            "qué",
            "cómo",
            "es",
            "una",
            "por",
            "para",
            "con",
            "cuál",
            "cuántos",
            "cuántas",
            "cuánto",
            "mi",
            "se",
            "del",
            "dónde",
            "cuándo",
            "quién",
            "está",
            "son",
            "puedo",
            "hay",
            "y",
            "al",
            "convertir",
            "hacer",
            "mejor",
        ],
    ),
    (
        "fr",
        &[
            "le",
            "les",
            "des",
            "du",
            "est",
            "quel",
            "quelle",
            "quels",
            "quelles",
            "comment",
            "une",
            "et",
            "pour",
            "avec",
            "je",
            "mon",
            "où",
            "pourquoi",
            "qu'est-ce",
            "c'est",
            "dans",
            "sur",
            "faire",
            "combien",
            "peut",
            "au",
            "aux",
            "ce",
            "qui",
            "sont",
            "puis",
        ],
    ),
    (
        "de",
        &[
            "der", "die", "das", "ist", "wie", "was", "und", "ein", "eine", "ich", "mit", "für",
            "von", "zu", "den", "dem", "welche", "welcher", "warum", "wo", "kann", "viele", "wann",
            "wer", "nicht", "auf", "im", "sind", "mache", "man",
        ],
    ),
    (
        "it",
        &[
            "il", "lo", "gli", "di", "della", "del", "che", "come", "è", "quale", "perché", "dove",
            "sono", "quanto", "quanti", "quando", "chi", "posso", "fare", "nel", "alla",
        ],
    ),
    (
        "pt",
        &[
            "os", "do", "da", "dos", "das", "como", "é", "um", "uma", "qual", "onde", "quando",
            "quem", "posso", "fazer", "não", "são", "em", "quantos", "quanto", "você", "meu",
        ],
    ),
    (
        "nl",
        &[
            "het", "een", "wat", "hoe", "van", "ik", "voor", "waar", "waarom", "welke", "wanneer",
            "wie", "kan", "zijn", "niet", "maak", "ik", "mijn",
        ],
    ),
];
